package measure

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100 on every Linux
// architecture Go supports here.
const clockTicks = 100

// Stat is what the harnesses read of a /proc/<pid>/stat line.
type Stat struct {
	PPid int
	// CPU is the process's own user + system time; ChildrenCPU its waited-for
	// children's (cutime + cstime).
	CPU, ChildrenCPU time.Duration
}

// ReadStat reads /proc/<pid>/stat.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Stat{}, err
	}
	return ParseStat(string(b))
}

// ParseStat parses a /proc/<pid>/stat line. The command name (field 2) may hold spaces
// and parentheses, so fields are counted after its last ')'.
func ParseStat(stat string) (Stat, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("/proc stat %q: no command", stat)
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state): ppid is field 4, utime..cstime are fields 14 to 17.
	if len(f) < 15 {
		return Stat{}, fmt.Errorf("/proc stat has %d fields after the command, want at least 15", len(f))
	}
	var v [5]int64
	for k, idx := range []int{1, 11, 12, 13, 14} {
		n, err := strconv.ParseInt(f[idx], 10, 64)
		if err != nil {
			return Stat{}, fmt.Errorf("/proc stat field %d %q: %w", idx+3, f[idx], err)
		}
		v[k] = n
	}
	return Stat{PPid: int(v[0]), CPU: ticks(v[1] + v[2]), ChildrenCPU: ticks(v[3] + v[4])}, nil
}

func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / clockTicks }

// Memory is a process's resident set now and its peak since it started (or since its
// peak was last reset), in bytes.
type Memory struct {
	RSS     int64 // VmRSS
	PeakRSS int64 // VmHWM
}

// ReadMemory reads /proc/<pid>/status; pid 0 reads this process's.
func ReadMemory(pid int) (Memory, error) {
	path := "/proc/self/status"
	if pid != 0 {
		path = fmt.Sprintf("/proc/%d/status", pid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Memory{}, err
	}
	return ParseStatus(string(b))
}

// ParseStatus reads VmRSS and VmHWM of a /proc/<pid>/status text; both must be there.
func ParseStatus(status string) (Memory, error) {
	var m Memory
	var seen int
	for line := range strings.SplitSeq(status, "\n") {
		for _, f := range []struct {
			prefix string
			to     *int64
		}{{"VmHWM:", &m.PeakRSS}, {"VmRSS:", &m.RSS}} {
			if rest, ok := strings.CutPrefix(line, f.prefix); ok {
				kb, err := kilobytes(rest)
				if err != nil {
					return Memory{}, fmt.Errorf("/proc status %s %w", f.prefix, err)
				}
				*f.to = kb << 10
				seen++
			}
		}
	}
	if seen != 2 {
		return Memory{}, errors.New("/proc status has no VmRSS or no VmHWM")
	}
	return m, nil
}

// ReadPss reads the proportional set size of /proc/<pid>/smaps_rollup (bytes): pages
// shared by several processes (one binary mapped by all) count once over all of them.
func ReadPss(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, err
	}
	return ParsePss(string(b))
}

// ParsePss reads the Pss line of a /proc/<pid>/smaps_rollup text (bytes).
func ParsePss(rollup string) (int64, error) {
	for line := range strings.SplitSeq(rollup, "\n") {
		if rest, ok := strings.CutPrefix(line, "Pss:"); ok {
			kb, err := kilobytes(rest)
			if err != nil {
				return 0, fmt.Errorf("smaps_rollup Pss %w", err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("smaps_rollup has no Pss line")
}

// kilobytes parses "   1234 kB".
func kilobytes(field string) (int64, error) {
	s := strings.TrimSuffix(strings.TrimSpace(field), " kB")
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: %w", field, err)
	}
	return n, nil
}
