package config

import (
	"fmt"
	"os"
	"reflect"
	"strings"
)

// Parse decodes a configuration file's content strictly, fills defaults and validates
// it, as Load does for a file; source names the file in every error line.
func Parse(data []byte, source string) (*Config, error) {
	c, err := Decode(data, source)
	if err != nil {
		return nil, err
	}
	c.Default()
	if err := c.Validate(); err != nil {
		return nil, prefixEach(source, err)
	}
	return c, nil
}

// Load reads the file at path, decodes it strictly, fills defaults and validates it.
// Every error line names the file.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading supervisor config: %w", err)
	}
	return Parse(data, path)
}

// liveFields are the top-level fields a running supervisor takes from a changed file:
// the instances, and the validation switch that only decides which instance sets are
// valid. Every other field is node-wide and fixed while it runs (tables, ports, the
// masquerade bit, the API client, the watches).
var liveFields = map[string]bool{"instances": true, "sharedTenants": true}

// FixedChanges lists, by their YAML names, the node-wide fields whose values (defaults
// filled in) differ between the running configuration and next: none may change
// without a restart. The masquerade bit is among them when adding or removing the
// default instance moves its default.
func FixedChanges(running, next *Config) []string {
	var out []string
	a, b := reflect.ValueOf(running).Elem(), reflect.ValueOf(next).Elem()
	t := a.Type()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if liveFields[name] || reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
			continue
		}
		out = append(out, name)
	}
	return out
}
