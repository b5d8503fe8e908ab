// Command shardproxy-soak runs the soak (package soak): `make soak`, hack/soak.sh. Root
// only. Settings come from flags, defaulted from the environment: SOAK_DURATION (10m),
// SOAK_SEED (random; printed, and replays a run), SOAK_SERVICES (1000), SOAK_RATE
// (changes per second, 10), SOAK_FAULTS_PER_KIND (3 from 10 minutes on, else 1),
// SOAK_CHECKPOINT_EVERY (90s), SOAK_FAULTS (the fault kinds to inject, comma-separated;
// default all). Exits 0 when the soak passed, 1 when it failed or could
// not run, 2 on a bad setting.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/rest"

	"github.com/shardproxy/shardproxy/test/soak"
)

func main() { os.Exit(run()) }

func run() int {
	fs := flag.NewFlagSet("shardproxy-soak", flag.ContinueOnError)
	repo := fs.String("repo", ".", "the repository root")
	duration := fs.Duration("duration", envDuration("SOAK_DURATION", 10*time.Minute), "how long changes and faults run")
	seed := fs.Uint64("seed", envUint("SOAK_SEED", rand.Uint64()), "seed of every random choice")
	services := fs.Int("services", int(envUint("SOAK_SERVICES", 1000)), "churned Services")
	rate := fs.Float64("rate", float64(envUint("SOAK_RATE", 10)), "changes per second")
	every := fs.Duration("checkpoint-every", envDuration("SOAK_CHECKPOINT_EVERY", 90*time.Second), "time between checkpoints")
	faults := fs.String("faults", os.Getenv("SOAK_FAULTS"), "comma-separated fault kinds to inject (default all)")
	perKind := fs.Int("faults-per-kind", 0, "injections of each fault kind (default SOAK_FAULTS_PER_KIND, else 3 from 10 minutes on, else 1)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *perKind == 0 {
		*perKind = int(envUint("SOAK_FAULTS_PER_KIND", 0))
	}
	if *perKind == 0 {
		*perKind = 1
		if *duration >= 10*time.Minute {
			*perKind = 3
		}
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "shardproxy-soak: needs root (network namespaces, nftables)")
		return 1
	}
	root, err := filepath.Abs(*repo)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	work, err := os.MkdirTemp("", "shardproxy-soak-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// client-go would print the API's deprecation warning of externalIPs at every change.
	rest.SetDefaultWarningHandler(rest.NoWarnings{})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	fmt.Printf("soak: seed %d (SOAK_SEED=%d replays it), %v, %d Services, %v changes/s, %d faults of each kind, work dir %s\n",
		*seed, *seed, *duration, *services, *rate, *perKind, work)
	sum, err := soak.Run(ctx, soak.Options{
		RepoRoot: root, WorkDir: work, Duration: *duration, Seed: *seed, Services: *services, Rate: *rate,
		CheckpointEvery: *every, FaultsPerKind: *perKind, Faults: splitList(*faults),
		Logf: func(format string, args ...any) { fmt.Printf("soak: "+format+"\n", args...) },
	})
	if err != nil {
		fmt.Printf("soak: could not run (seed %d): %v; logs kept in %s\n", *seed, err, work)
		return 1
	}
	fmt.Print(sum)
	if len(sum.Problems()) > 0 {
		fmt.Printf("soak: logs kept in %s (shardproxy.log: the supervisor)\n", work)
		return 1
	}
	os.RemoveAll(work)
	return 0
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return d
	}
	return def
}

func envUint(name string, def uint64) uint64 {
	if n, err := strconv.ParseUint(os.Getenv(name), 10, 64); err == nil {
		return n
	}
	return def
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
