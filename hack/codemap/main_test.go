package main

import (
	"bytes"
	"fmt"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

func TestLengths(t *testing.T) {
	const src = `package p

type T[K any] struct{}

func one() {}

func (t *T[K]) three() {
	_ = t
}

func (T[K]) generic() {
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, fn := range lengths(fset, f) {
		got = append(got, fmt.Sprintf("%s:%d", fn.name, fn.lines))
	}
	if want := "one:1 T.three:3 T.generic:2"; strings.Join(got, " ") != want {
		t.Errorf("lengths: %q, want %q", strings.Join(got, " "), want)
	}
}

// TestRepositoryProtocols runs the command on this repository: every protocol's names
// are declared in its folders, so a renamed or moved one fails here as it would for a
// reader running it.
func TestRepositoryProtocols(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"-root", "../..", "-top", "5"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"over 100 lines; the 5 longest:", "bucket chains", "  declared in: tables/bucket.go\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
