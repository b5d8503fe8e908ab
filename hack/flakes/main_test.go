package main

import (
	"strings"
	"testing"
)

func TestReport(t *testing.T) {
	const pass, fail = `"Action":"pass"`, `"Action":"fail"`
	line := func(pkg, test, action string) string {
		return `{"Package":"` + pkg + `","Test":"` + test + `",` + action + "}\n"
	}
	for _, tc := range []struct {
		name   string
		in     string
		rc     int
		want   []string
		absent []string
	}{
		{"all green", line("p", "TestA", pass) + line("p", "TestA", pass), 0,
			[]string{"1 tests (subtests included), 2 runs, 0 failed at least once"}, []string{"FLAKY"}},
		{"one of three failed", line("p", "TestA", pass) + line("p", "TestA", fail) + line("p", "TestA", pass) +
			line("p", "TestB", pass) + `{"Package":"p",` + fail + "}\n", 1,
			[]string{"FLAKY p TestA: failed 1 of 3 runs", "2 tests (subtests included), 4 runs, 1 failed at least once"},
			[]string{"TestB:"}},
		{"package crashed without a failed test", line("p", "TestA", pass) + `{"Package":"p",` + fail + "}\n", 1,
			[]string{"packages failed: 1"}, []string{"FLAKY"}},
		{"non-JSON lines are ignored", "# build output\n" + line("p", "TestA", pass), 0,
			[]string{"1 tests"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			if rc := report(strings.NewReader(tc.in), &out, "unit"); rc != tc.rc {
				t.Errorf("exit %d, want %d; output:\n%s", rc, tc.rc, out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			for _, a := range tc.absent {
				if strings.Contains(out.String(), a) {
					t.Errorf("output has %q:\n%s", a, out.String())
				}
			}
		})
	}
}
