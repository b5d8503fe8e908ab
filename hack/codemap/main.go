// Command codemap prints where a reader of this repository has to look: the longest
// functions of the non-test Go files, and, per protocol the code follows, the files
// that declare its names and those that use them. Run it from the repository's root:
//
//	go run ./hack/codemap            # the 15 longest functions, then the protocols
//	go run ./hack/codemap -top 40 -tests
//
// The protocols and their names are the table below: a name moved, renamed or gone
// shows as a protocol declared nowhere, which the command reports (exit status 1).
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// protocol is a contract several stages of the code share, and the names (types,
// functions, methods) that carry it.
type protocol struct {
	name string
	// dirs are the folders whose files are read for it.
	dirs  []string
	names []string
}

// protocols are the ones issue #34 gave one home each.
var protocols = []protocol{
	{"bucket chains (rule order, each rule as its parts, a chain's edit)", []string{"tables"},
		[]string{"BucketRule", "ChainEdit", "PlacedRule", "ruleGroup", "heldGroup", "groupEdit", "appendOnly", "foundIn"}},
	{"kernel writers: knftables, the streamed nft -f script", []string{"tables"},
		[]string{"NFTApplier", "ScriptRunner", "appendElementCommand"}},
	{"kernel writers: netlink (google/nftables, raw netlink; conntrack flows)", []string{"tables", "supervisor/conntrack"},
		[]string{"NetlinkWriter", "ListTables", "netlinkMessages", "Netlink", "DeleteFilters"}},
	{"supervisor lifecycle (wiring, servers, loops, orphan tables)", []string{"supervisor", "cmd/shardproxy/app"},
		[]string{"wire", "startServers", "startLoops", "withDefaults", "takeOverTables", "deleteUnconfiguredTables", "cleanupCommand", "deleteTable"}},
}

// reads reports whether file (relative to the root) is in one of p's folders, not in
// a subfolder of one.
func (p protocol) reads(file string) bool {
	return slices.Contains(p.dirs, filepath.ToSlash(filepath.Dir(file)))
}

// funcLen is a function or method and its length in lines, braces included.
type funcLen struct {
	pos   token.Position
	name  string
	lines int
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("codemap", flag.ContinueOnError)
	fl.SetOutput(stderr)
	top := fl.Int("top", 15, "how many of the longest functions to list")
	tests := fl.Bool("tests", false, "read _test.go files too")
	root := fl.String("root", ".", "the repository's root")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	files, err := goFiles(*root, *tests)
	if err != nil {
		fmt.Fprintln(stderr, "codemap:", err)
		return 1
	}
	fset := token.NewFileSet()
	var funcs []funcLen
	declared, used := map[string]map[string]bool{}, map[string]map[string]bool{}
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			fmt.Fprintln(stderr, "codemap:", err)
			return 1
		}
		funcs = append(funcs, lengths(fset, f)...)
		rel, _ := filepath.Rel(*root, path)
		indexNames(f, rel, declared, used)
	}
	sort.SliceStable(funcs, func(i, j int) bool { return funcs[i].lines > funcs[j].lines })
	over := 0
	for _, fn := range funcs {
		if fn.lines > 100 {
			over++
		}
	}
	fmt.Fprintf(stdout, "%d functions in %d files, %d over 100 lines; the %d longest:\n", len(funcs), len(files), over, min(*top, len(funcs)))
	for _, fn := range funcs[:min(*top, len(funcs))] {
		rel, _ := filepath.Rel(*root, fn.pos.Filename)
		fmt.Fprintf(stdout, "%5d  %s  %s:%d\n", fn.lines, fn.name, rel, fn.pos.Line)
	}
	status := 0
	for _, p := range protocols {
		decl, use := map[string]bool{}, map[string]bool{}
		for _, n := range p.names {
			for file := range declared[n] {
				if p.reads(file) {
					decl[file] = true
				}
			}
			for file := range used[n] {
				if p.reads(file) {
					use[file] = true
				}
			}
		}
		for file := range decl {
			delete(use, file)
		}
		fmt.Fprintf(stdout, "\n%s\n  declared in: %s\n  used in:     %s\n", p.name, list(decl), list(use))
		for _, n := range p.names {
			if !slices.ContainsFunc(slices.Collect(maps.Keys(declared[n])), p.reads) {
				fmt.Fprintf(stderr, "codemap: %s: %s is declared nowhere\n", p.name, n)
				status = 1
			}
		}
	}
	return status
}

// goFiles returns the Go files under root, without vendor, testdata, hidden folders
// and, unless tests, _test.go files.
func goFiles(root string, tests bool) ([]string, error) {
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "vendor" || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") && (tests || !strings.HasSuffix(path, "_test.go")) {
			out = append(out, path)
		}
		return nil
	})
	return out, err
}

// lengths returns the length of every function and method of f.
func lengths(fset *token.FileSet, f *ast.File) []funcLen {
	var out []funcLen
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		start, end := fset.Position(fd.Pos()), fset.Position(fd.End())
		out = append(out, funcLen{pos: start, name: funcName(fd), lines: end.Line - start.Line + 1})
	}
	return out
}

// funcName is "Name" for a function, "Type.Name" for a method.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
			continue
		case *ast.IndexExpr:
			t = x.X
			continue
		case *ast.IndexListExpr:
			t = x.X
			continue
		case *ast.Ident:
			return x.Name + "." + fd.Name.Name
		}
		return fd.Name.Name
	}
}

// indexNames records, per name, the files of f that declare it at the top level (a
// type, function, method, variable or constant) and those that use it.
func indexNames(f *ast.File, file string, declared, used map[string]map[string]bool) {
	add := func(m map[string]map[string]bool, name string) {
		if m[name] == nil {
			m[name] = map[string]bool{}
		}
		m[name][file] = true
	}
	declIdents := map[*ast.Ident]bool{}
	for _, id := range topLevelNames(f) {
		add(declared, id.Name)
		declIdents[id] = true
	}
	ast.Inspect(f, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && !declIdents[id] {
			add(used, id.Name)
		}
		return true
	})
}

// topLevelNames returns the names f declares at the top level: its types, functions,
// methods, variables and constants.
func topLevelNames(f *ast.File) []*ast.Ident {
	var out []*ast.Ident
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok {
			out = append(out, fd.Name)
			continue
		}
		for _, s := range d.(*ast.GenDecl).Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				out = append(out, s.Name)
			case *ast.ValueSpec:
				out = append(out, s.Names...)
			}
		}
	}
	return out
}

// list returns the files, sorted, on one line ("-" for none).
func list(files map[string]bool) string {
	if len(files) == 0 {
		return "-"
	}
	return strings.Join(slices.Sorted(maps.Keys(files)), " ")
}
