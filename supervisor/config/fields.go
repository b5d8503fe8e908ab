package config

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// maxCheckedNodes bounds the walk of checkFields: aliases can make a small file a large
// tree, and yaml.v3 refuses excessive aliasing only when it decodes. A configuration
// has thousands of nodes at most.
const maxCheckedNodes = 1 << 18

// fieldChecker walks a YAML tree against the Go type it will be decoded into and
// reports, by field path and line, what yaml.v3 would report by Go type: unknown
// fields (with the nearest known name), duplicate keys, values of the wrong kind. It
// removes every pair and list entry it reports from the tree, so that decoding what is
// left cannot fail again on the same mistake: one problem, one error. A duplicate key's
// later values are not read at all.
type fieldChecker struct {
	errs     []lineError
	reported map[string]bool // field paths with a problem
	visited  int
}

// lineError is a decode problem and the line it is on, to list problems in file order.
type lineError struct {
	line int
	err  error
}

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

// checkFields checks the document's top node against Config and returns the problems
// in file order, each "line N: path: problem", the field paths they are about, and
// whether the walk went over the whole tree (not stopped by maxCheckedNodes).
func checkFields(n *yaml.Node) ([]error, map[string]bool, bool) {
	fc := &fieldChecker{reported: map[string]bool{}}
	fc.check(n, reflect.TypeFor[Config](), "")
	slices.SortStableFunc(fc.errs, func(a, b lineError) int { return a.line - b.line })
	out := make([]error, len(fc.errs))
	for i, e := range fc.errs {
		out[i] = e.err
	}
	return out, fc.reported, fc.visited <= maxCheckedNodes
}

func (fc *fieldChecker) add(n *yaml.Node, path, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	fc.reported[path] = true
	if path != "" {
		msg = path + ": " + msg
	}
	fc.errs = append(fc.errs, lineError{n.Line, fmt.Errorf("line %d: %s", n.Line, msg)})
}

// check reports whether n can be decoded into a t, after removing from n what cannot.
func (fc *fieldChecker) check(n *yaml.Node, t reflect.Type, path string) bool {
	if fc.visited++; fc.visited > maxCheckedNodes {
		if fc.visited == maxCheckedNodes+1 {
			fc.add(n, path, "the document expands to more than %d nodes through aliases", maxCheckedNodes)
		}
		return false
	}
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return true // leaves the field unset
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return fc.unmarshaler(n, t, path)
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
		if reflect.PointerTo(t).Implements(unmarshalerType) {
			return fc.unmarshaler(n, t, path)
		}
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			fc.add(n, path, "want a mapping%s, not %s", docName(path), describe(n))
			return false
		}
		fc.mapping(n, t, path)
		return true
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			hint := ""
			if n.Kind == yaml.ScalarNode && t.Elem().Kind() == reflect.String {
				hint = fmt.Sprintf(": write [%s]", n.Value)
			}
			fc.add(n, path, "want a list, not %s%s", describe(n), hint)
			return false
		}
		kept := make([]*yaml.Node, 0, len(n.Content))
		for i, e := range n.Content {
			if fc.check(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i)) {
				kept = append(kept, e)
			}
		}
		n.Content = kept
		return true
	default:
		return fc.scalar(n, t, path)
	}
}

// unmarshaler decodes n with t's own UnmarshalYAML, whose messages start "line N: ".
func (fc *fieldChecker) unmarshaler(n *yaml.Node, t reflect.Type, path string) bool {
	err := n.Decode(reflect.New(t).Interface())
	if err == nil {
		return true
	}
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		fc.add(n, path, "%s", strings.TrimPrefix(err.Error(), "yaml: "))
		return false
	}
	for _, msg := range te.Errors {
		fc.add(n, path, "%s", linePrefix.ReplaceAllString(msg, ""))
	}
	return false
}

var linePrefix = regexp.MustCompile(`^line \d+: `)

func (fc *fieldChecker) scalar(n *yaml.Node, t reflect.Type, path string) bool {
	want := "a " + t.Kind().String()
	switch t.Kind() {
	case reflect.String:
		want = "a string"
	case reflect.Bool:
		want = "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		want = "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		want = "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		want = "a number"
	}
	if n.Kind != yaml.ScalarNode {
		fc.add(n, path, "want %s, not %s", want, describe(n))
		return false
	}
	if err := n.Decode(reflect.New(t).Interface()); err == nil {
		return true
	}
	if n.ShortTag() == "!!int" {
		if lo, hi, ok := intRange(t); ok {
			fc.add(n, path, "%s is out of range [%s, %s]", n.Value, lo, hi)
			return false
		}
	}
	fc.add(n, path, "want %s, not %s", want, describe(n))
	return false
}

// intRange is the range of an integer type, as text.
func intRange(t reflect.Type) (string, string, bool) {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		bits := t.Bits()
		return strconv.FormatInt(-1<<(bits-1), 10), strconv.FormatInt(1<<(bits-1)-1, 10), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "0", strconv.FormatUint(math.MaxUint64>>(64-t.Bits()), 10), true
	}
	return "", "", false
}

// mapping checks the keys of n against t's fields: unknown and duplicate keys are
// reported and removed, and so is every pair whose value is wrong.
func (fc *fieldChecker) mapping(n *yaml.Node, t reflect.Type, path string) {
	fields := yamlFields(t)
	type seenKey struct {
		key   *yaml.Node
		lines []int
	}
	seen := map[string]*seenKey{}
	var dups []string
	kept := make([]*yaml.Node, 0, len(n.Content))
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			if fc.merge(v, t, path) {
				kept = append(kept, k, v)
			}
			continue
		}
		if k.Kind != yaml.ScalarNode {
			fc.add(k, path, "a key must be a field name, not %s", describe(k))
			continue
		}
		name := k.Value
		fp := joinPath(path, name)
		if s, dup := seen[name]; dup {
			if len(s.lines) == 1 {
				dups = append(dups, name)
			}
			s.lines = append(s.lines, k.Line)
			continue // not read: one mistake, one error
		}
		seen[name] = &seenKey{key: k, lines: []int{k.Line}}
		ft, ok := fields[name]
		if !ok {
			fc.add(k, fp, "unknown field%s", suggestField(name, t))
			continue
		}
		if fc.check(v, ft, fp) {
			kept = append(kept, k, v)
		}
	}
	for _, name := range dups {
		s := seen[name]
		lines := make([]string, len(s.lines))
		for i, l := range s.lines {
			lines[i] = strconv.Itoa(l)
		}
		second := &yaml.Node{Line: s.lines[1]}
		fc.add(second, joinPath(path, name), "duplicate key, on lines %s: keep one", joinAnd(lines))
	}
	n.Content = kept
}

// merge checks the value of a "<<" merge key: a mapping or a list of mappings, each
// holding fields of t. Its keys may repeat the mapping's own (those win), so they are
// not duplicates.
func (fc *fieldChecker) merge(v *yaml.Node, t reflect.Type, path string) bool {
	for v.Kind == yaml.AliasNode && v.Alias != nil {
		v = v.Alias
	}
	var maps []*yaml.Node
	switch v.Kind {
	case yaml.MappingNode:
		maps = []*yaml.Node{v}
	case yaml.SequenceNode:
		for _, m := range v.Content {
			for m.Kind == yaml.AliasNode && m.Alias != nil {
				m = m.Alias
			}
			if m.Kind != yaml.MappingNode {
				fc.add(m, joinPath(path, "<<"), "want a mapping to merge, not %s", describe(m))
				return false
			}
			maps = append(maps, m)
		}
	default:
		fc.add(v, joinPath(path, "<<"), "want a mapping or a list of mappings to merge, not %s", describe(v))
		return false
	}
	for _, m := range maps {
		fc.mapping(m, t, path)
	}
	return true
}

// yamlFields maps the YAML names of t's fields to their types; inline structs add
// their fields.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if strings.Contains(opts, "inline") && f.Type.Kind() == reflect.Struct {
			for k, v := range yamlFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f.Type
	}
	return out
}

// suggestField says which known field an unknown name probably meant: one spelled the
// same but for case, "-" and "_"; else the nearest by edit distance, if near enough;
// else a field of a nested mapping by that name ("namespaces" in an instance is
// "tenant.namespaces"). With no such field it lists the known ones, when they are few.
func suggestField(name string, t reflect.Type) string {
	fields := yamlFields(t)
	names := make([]string, 0, len(fields))
	for f := range fields {
		names = append(names, f)
	}
	slices.Sort(names)

	norm := func(s string) string {
		return strings.ToLower(strings.NewReplacer("-", "", "_", "").Replace(s))
	}
	best, bestD := "", math.MaxInt
	for _, f := range names {
		if norm(f) == norm(name) {
			return fmt.Sprintf("; did you mean %q?", f)
		}
		if d := editDistance(strings.ToLower(name), strings.ToLower(f)); d < bestD {
			best, bestD = f, d
		}
	}
	if bestD <= max(1, min(3, len(name)/4)) {
		return fmt.Sprintf("; did you mean %q?", best)
	}
	for _, f := range names {
		ft := fields[f]
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() != reflect.Struct || reflect.PointerTo(ft).Implements(unmarshalerType) {
			continue
		}
		for g := range yamlFields(ft) {
			if norm(g) == norm(name) {
				return fmt.Sprintf("; did you mean %q?", f+"."+g)
			}
		}
	}
	if len(names) <= 8 {
		return "; the fields here are " + joinAnd(names)
	}
	return ""
}

// editDistance is the optimal string alignment distance of a and b: insertions,
// deletions, substitutions and swaps of neighbours each cost one.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}

func joinPath(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// docName names what the top of the file must be.
func docName(path string) string {
	if path == "" {
		return " (a " + Kind + ")"
	}
	return ""
}

// describe names what a node is, for "want X, not Y".
func describe(n *yaml.Node) string {
	if n.Kind == yaml.ScalarNode {
		return strconv.Quote(n.Value)
	}
	return "a " + kindName(n.Kind)
}
