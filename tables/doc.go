// Package tables is shardproxy's nftables compiler and syncer: it turns a plain model of
// Service ports and endpoints (model.go, free of Kubernetes API types) into one
// instance's `ip` or `ip6` table and keeps that table in step, partially when it can.
//
// A sync is a pipeline: compile.go turns a Service port into element ids and chains; the
// ledger (ledger.go) records what the table holds and what a change did; diff.go turns
// that into a Diff, a plain value; an Applier (apply.go: nft; netlink.go: netlink)
// writes the Diff in one transaction. sync.go's Syncer runs the pipeline. bucket.go keeps
// the one protocol these stages share, the bucket chains: the order of their rules, and
// each rule kept as its parts, which both writers write it from.
// names.go and priority.go fix the object names and hook priorities other components may
// rely on; README.md beside this file is that contract.
//
// # Ways to the kernel
//
// There are four, each used where the others cost more or cannot:
//
//   - knftables (sigs.k8s.io/knftables), for what is small or read: listing a table's
//     chains and sets before a full sync (over netlink, knftables.UseNetlink),
//     DeleteTable, and every write into knftables' Fake in tests and `render`. Its
//     Transaction carries one knftables.Element per element (NFTApplier.knftTransaction).
//   - The streamed `nft -f -` script (NewNFT's ScriptRunner, NFTApplier.stream), for every
//     Diff that needs rule text: full syncs and partial ones that write rules other than
//     the bucket rules NetlinkWriter encodes. knftables renders its commands a chunk at a
//     time, except the element commands, which apply.go writes itself, many elements to
//     a command (appendElementCommand). Only nft compiles rule text.
//   - google/nftables over netlink (NetlinkWriter), for the partial syncs that need no
//     rule text but the bucket rules it encodes itself (BucketRule.exprs: round-robin
//     and affinity rules, but consistentHash's affinity picks): nft dumps the node's
//     whole ruleset before each transaction, so a small change through it grows with
//     the node; over netlink it costs what it changes.
//   - Raw netlink (mdlayher/netlink), where neither library answers: ListTables reads
//     every table of a family with its comment (the ownership marker) without dumping
//     their rules. Outside this package, supervisor/conntrack deletes conntrack flows
//     over netlink the same way.
package tables
