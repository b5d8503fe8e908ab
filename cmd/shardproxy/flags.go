package main

import (
	"bufio"
	"flag"
	"io"

	"k8s.io/klog/v2"
)

// flagSet registers klog's flags on a private flag set, so verbosity can be set
// without package-level flags.
func flagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	return fs
}

func newBufReader(r io.Reader) *bufio.Reader { return bufio.NewReader(r) }
