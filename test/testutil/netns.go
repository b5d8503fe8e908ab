package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"os/exec"
	"testing"
)

// NewNetns creates a network namespace named prefix plus a random suffix and deletes it
// when the test ends, reporting a failed deletion.
func NewNetns(t testing.TB, prefix string) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := prefix + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	return name
}
