package soak

import (
	"fmt"
	"os"
	"path/filepath"
)

// nftWrapper is the `nft` the supervisor finds first on its PATH. It passes everything
// to the real nft but transactions (`nft -f -` without --check), which it can hold or
// fail on the soak's say, through files in the control directory:
//
//	hold-full   while it exists, a full sync's transaction (one that flushes maps) first
//	            writes held.<pid> (holding its table's name) and waits (at most 30 s)
//	nft-fail    a percentage: that share of transactions fail before nft runs; each
//	            failure appends a line to nft-failed
//
// It keeps each transaction in the control directory while it runs (tx.*): a wrapper
// killed with the supervisor leaves it there, inside the soak's work directory.
const nftWrapper = `#!/bin/sh
# The soak's nft wrapper (test/soak/wrapper.go): fault injection for the supervisor.
ctl=%q
real=%q
case " $* " in
*" --check "*) exec "$real" "$@" ;;
*" -f - ") ;;
*) exec "$real" "$@" ;;
esac
tmp=$(mktemp "$ctl/tx.XXXXXX") || exit 1
trap 'rm -f "$tmp"' EXIT
cat >"$tmp"
if [ -e "$ctl/hold-full" ] && grep -q '^flush map' "$tmp"; then
	sed -n 's/^add table \([a-z0-9]* [^ ]*\).*/\1/p' "$tmp" | head -1 >"$ctl/.held.$$"
	mv "$ctl/.held.$$" "$ctl/held.$$"
	n=0
	while [ -e "$ctl/hold-full" ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n + 1)); done
fi
if [ -r "$ctl/nft-fail" ]; then
	pct=$(cat "$ctl/nft-fail")
	draw=$(( $(od -An -N2 -tu2 /dev/urandom) %% 100 ))
	if [ "$draw" -lt "$pct" ]; then
		echo "Error: injected nft fault (soak: $ctl/nft-fail)" >&2
		echo x >>"$ctl/nft-failed"
		exit 1
	fi
fi
"$real" "$@" <"$tmp"
`

// writeWrapper writes the nft wrapper into dir and returns dir, for the front of PATH.
func writeWrapper(dir, ctl, realNFT string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	script := fmt.Sprintf(nftWrapper, ctl, realNFT)
	return os.WriteFile(filepath.Join(dir, "nft"), []byte(script), 0o755)
}
