package tables

import (
	"strings"
)

// renderedDiff is a Diff as nft is given it, as text.
type renderedDiff interface {
	String() string
	NumOperations() int
}

// transaction renders d as nft is given it, from knftables alone: its transaction of
// one knftables.Element per element, whose consecutive element commands of one set are
// then joined perCommand at a time, as nft's grammar allows. It is the reference the
// streamed script, whose element commands are NFTApplier's own, is compared with.
func (a *NFTApplier) transaction(d *Diff) renderedDiff {
	tx := a.knftTransaction(d)
	if a.perCommand == 1 {
		return tx
	}
	out := &joinedScript{}
	prefix, n := "", 0
	for line := range strings.Lines(tx.String()) {
		m := elementCommand.FindStringSubmatch(strings.TrimSuffix(line, "\n"))
		if m == nil || !strings.HasSuffix(line, "\n") {
			out.end(&prefix)
			out.lines = append(out.lines, line)
			continue
		}
		if p := m[1] + " element " + m[2] + " { "; p != prefix || n == a.perCommand {
			out.end(&prefix)
			prefix, n = p, 0
			out.lines = append(out.lines, p)
		} else {
			out.lines[len(out.lines)-1] += ", "
		}
		out.lines[len(out.lines)-1] += m[3]
		n++
	}
	out.end(&prefix)
	return out
}

// joinedScript is transaction's text, a command a line.
type joinedScript struct{ lines []string }

// end closes the element command being joined, if any.
func (s *joinedScript) end(prefix *string) {
	if *prefix != "" {
		s.lines[len(s.lines)-1] += " }\n"
		*prefix = ""
	}
}

func (s *joinedScript) String() string     { return strings.Join(s.lines, "") }
func (s *joinedScript) NumOperations() int { return len(s.lines) }
