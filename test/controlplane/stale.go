package controlplane

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Where etcd's data goes when there is a tmpfs for it, and the prefixes of our directories.
const (
	shmDir    = "/dev/shm"
	shmPrefix = "shardproxy-etcd-"
	dirPrefix = "shardproxy-controlplane-"
	ownerFile = "owner.pid"
)

// writeOwner records our pid in dir, so that a later start can tell the directory of a
// control plane whose process was killed before it could clean up.
func writeOwner(dir string) error {
	return os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644)
}

// removeStale removes the directories of control planes whose process is gone: a test
// binary killed by a timeout leaves them behind, and etcd's data holds over 100 MB of
// tmpfs. Their processes died with it (they get SIGKILL when their parent dies). Failing
// here only leaves garbage, so errors are reported, not returned.
func removeStale(tmpDir string, progress func(string, ...any)) {
	for _, pattern := range []string{
		filepath.Join(shmDir, shmPrefix+"*"),
		filepath.Join(tmpDir, dirPrefix+"*"),
	} {
		dirs, _ := filepath.Glob(pattern)
		for _, dir := range dirs {
			data, err := os.ReadFile(filepath.Join(dir, ownerFile))
			if err != nil {
				continue // not ours, or being created right now
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
			if err != nil || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
				continue
			}
			if err := os.RemoveAll(dir); err != nil {
				progress("removing %s, left by dead process %d: %v", dir, pid, err)
				continue
			}
			progress("removed %s, left by dead process %d", dir, pid)
		}
	}
}
