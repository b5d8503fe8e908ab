package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		name     string
		in       string
		wantCode int
		want     []string
		notWant  []string
	}{
		{
			name: "pass, skip and figures",
			in: `{"Action":"output","Package":"p","Test":"TestA","Output":"e2e: handover 0 failed\n"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"pass","Package":"p","Test":"TestA/sub"}
{"Action":"output","Package":"p","Test":"TestB","Output":"    x_test.go:1: needs root\n"}
{"Action":"skip","Package":"p","Test":"TestB"}
{"Action":"pass","Package":"p"}`,
			wantCode: 0,
			want:     []string{"e2e: handover 0 failed", "LAYER unit         ok: 1 passed, 0 failed, 1 skipped, 1 packages", "skipped: p.TestB: x_test.go:1: needs root"},
		},
		{
			name: "a failed test shows its output",
			in: `{"Action":"output","Package":"p","Test":"TestC","Output":"    c_test.go:9: boom\n"}
{"Action":"fail","Package":"p","Test":"TestC"}
{"Action":"fail","Package":"p"}`,
			wantCode: 1,
			want:     []string{"--- FAIL p.TestC:", "c_test.go:9: boom", "LAYER unit         FAIL: 0 passed, 1 failed", "failed tests: p.TestC"},
		},
		{
			name: "a build failure fails the layer and shows the compiler",
			in: `{"ImportPath":"p [p.test]","Action":"build-output","Output":"p/x.go:3:1: syntax error\n"}
{"Action":"output","Package":"p","Output":"FAIL\tp [build failed]\n"}
{"Action":"fail","Package":"p"}`,
			wantCode: 1,
			want:     []string{"p/x.go:3:1: syntax error", "failed packages: p"},
			notWant:  []string{" ok: "},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			code := summarize(strings.NewReader(tc.in), &out, "unit", []string{"e2e: "})
			if code != tc.wantCode {
				t.Errorf("exit code %d, want %d\n%s", code, tc.wantCode, out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(out.String(), w) {
					t.Errorf("output has %q:\n%s", w, out.String())
				}
			}
		})
	}
}
