package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"gopkg.in/yaml.v3"
)

// Decode parses one SupervisorConfig document strictly: unknown and duplicate fields,
// values of the wrong type, a second document and a wrong apiVersion or kind are all
// errors, reported together, each naming source (usually the file name) and, where
// YAML knows it, the line. Decode neither defaults nor validates; see Load.
func Decode(data []byte, source string) (*Config, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)

	var c Config
	var errs []error
	if err := dec.Decode(&c); err != nil {
		var te *yaml.TypeError
		switch {
		case errors.Is(err, io.EOF):
			return nil, prefixEach(source, errors.New("empty file: want one SupervisorConfig document"))
		case errors.As(err, &te):
			for _, msg := range te.Errors {
				errs = append(errs, errors.New(msg))
			}
		default: // a syntax error: nothing after it can be trusted
			return nil, prefixEach(source, errors.New(strings.TrimPrefix(err.Error(), "yaml: ")))
		}
	}

	for {
		var extra yaml.Node
		err := dec.Decode(&extra)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			errs = append(errs, errors.New(strings.TrimPrefix(err.Error(), "yaml: ")))
			break
		}
		if isEmptyDocument(&extra) {
			continue
		}
		errs = append(errs, fmt.Errorf("line %d: a second YAML document; the file must hold exactly one", extra.Line))
		break
	}

	if c.APIVersion != APIVersion {
		errs = append(errs, fmt.Errorf("apiVersion: %q is not supported, want %q", c.APIVersion, APIVersion))
	}
	if c.Kind != Kind {
		errs = append(errs, fmt.Errorf("kind: %q is not supported, want %q", c.Kind, Kind))
	}
	if len(errs) > 0 {
		return nil, prefixEach(source, errors.Join(errs...))
	}
	return &c, nil
}

// isEmptyDocument reports whether n is a document holding nothing, as a trailing "---"
// produces.
func isEmptyDocument(n *yaml.Node) bool {
	if n.Kind != yaml.DocumentNode {
		return false
	}
	return len(n.Content) == 0 ||
		(len(n.Content) == 1 && n.Content[0].Kind == yaml.ScalarNode && n.Content[0].ShortTag() == "!!null")
}

// prefixEach puts "source: " before every error joined in err, so that each line of
// the message names the file.
func prefixEach(source string, err error) error {
	if source == "" || err == nil {
		return err
	}
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return fmt.Errorf("%s: %w", source, err)
	}
	var out []error
	for _, e := range joined.Unwrap() {
		out = append(out, fmt.Errorf("%s: %w", source, e))
	}
	return errors.Join(out...)
}
