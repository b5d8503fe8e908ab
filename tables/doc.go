// Package tables is shardproxy's nftables compiler and syncer: it turns a plain model of
// Service ports and endpoints (model.go, free of Kubernetes API types) into one
// instance's `ip` or `ip6` table and keeps that table in step, partially when it can.
//
// A sync is a pipeline: compile.go turns a Service port into element ids and chains; the
// ledger (ledger.go) records what the table holds and what a change did; diff.go turns
// that into a Diff, a plain value; an Applier (apply.go: nft; netlink.go: netlink)
// writes the Diff in one transaction. sync.go's Syncer runs the pipeline. names.go and
// priority.go fix the object names and hook priorities other components may rely on;
// README.md beside this file is that contract.
package tables
