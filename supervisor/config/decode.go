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
// values of the wrong kind, a second document and a wrong apiVersion or kind are all
// errors, reported together in file order, each naming source (usually the file name),
// the line, the field path and, for an unknown field, the nearest known one. One
// mistake is one error: a duplicate key's later values are not read, and a value that
// cannot be decoded leaves its field unset rather than its whole mapping. Decode
// neither defaults nor validates; see Load.
func Decode(data []byte, source string) (*Config, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))

	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, prefixEach(source, errors.New("empty file: want one SupervisorConfig document"))
		}
		// A syntax error: nothing after it can be trusted.
		return nil, prefixEach(source, errors.New(strings.TrimPrefix(err.Error(), "yaml: ")))
	}
	if isEmptyDocument(&doc) {
		return nil, prefixEach(source, errors.New("empty file: want one SupervisorConfig document"))
	}

	var c Config
	top := doc.Content[0]
	errs, reported, complete := checkFields(top)
	topOK := top.Kind == yaml.MappingNode && complete
	if topOK {
		if err := top.Decode(&c); err != nil {
			// checkFields removed what it knows cannot decode; this is what it missed.
			var te *yaml.TypeError
			if !errors.As(err, &te) {
				errs = append(errs, errors.New(strings.TrimPrefix(err.Error(), "yaml: ")))
			} else {
				for _, msg := range te.Errors {
					errs = append(errs, errors.New(msg))
				}
			}
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

	// A file that is not a mapping, or an apiVersion already reported, is not
	// checked again: that would be a follow-on error.
	if topOK && !reported["apiVersion"] && c.APIVersion != APIVersion {
		errs = append(errs, fmt.Errorf("apiVersion: %q is not supported, want %q", c.APIVersion, APIVersion))
	}
	if topOK && !reported["kind"] && c.Kind != Kind {
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
