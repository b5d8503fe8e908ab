package bench

import "github.com/shardproxy/shardproxy/tables"

// Report is everything one run measured; it is written as JSON.
type Report struct {
	Machine   Machine       `json:"machine"`
	Endpoints int           `json:"endpointsPerService"`
	Scales    []ScaleResult `json:"scales"`
	// Packet is the per-packet cost at a small and a large number of Services.
	Packet []PacketResult `json:"packet,omitempty"`
	// Checks compares the figures with the targets of issue 6.
	Checks []Check `json:"checks"`
	// Upstream compares them with upstream kube-proxy (nftables mode) on the same machine type.
	Upstream []UpstreamComparison `json:"upstream"`
	Seconds  float64              `json:"seconds"`
}

// Machine describes where the run happened.
type Machine struct {
	Cores  int    `json:"cores"`
	Kernel string `json:"kernel"`
	NFT    string `json:"nft"`
	Go     string `json:"go"`
}

// ScaleResult is one number of Services.
type ScaleResult struct {
	Services int `json:"services"`
	// Mode is the load-balancing mode of every Service.
	Mode tables.LBMode `json:"mode"`
	ChildResult
	// Floor is the time `nft -f` alone takes to load the ruleset the full sync left
	// (its `nft list ruleset` dump) into a fresh namespace: the best any proxy could do.
	Floor FloorResult `json:"floor"`
	// FullOverFloor is Full.Seconds / Floor.Seconds.
	FullOverFloor float64 `json:"fullOverFloor"`
	// ScriptFloor is the time `nft -f` alone takes to run the scripts the first full
	// sync streamed to nft, the families' at once as the instance runs them, into a
	// fresh namespace: the full sync's own input without the Go side that wrote it.
	ScriptFloor FloorResult `json:"scriptFloor"`
	// FullOverScriptFloor is Full.Seconds / ScriptFloor.Seconds.
	FullOverScriptFloor float64 `json:"fullOverScriptFloor"`
	// Multi is the same Services spread over several instances in one process.
	Multi *MultiResult `json:"multi,omitempty"`
	// ExtraInstanceMB is (Multi peak RSS - single peak RSS) / (instances - 1).
	ExtraInstanceMB float64 `json:"extraInstanceMB,omitempty"`
}

// ChildResult is what the single-instance child measures.
type ChildResult struct {
	// Full is the first full sync into an empty namespace (start of the proxy).
	Full FullSync `json:"full"`
	// Resync is a second full sync over the populated table (the periodic one).
	Resync    FullSync  `json:"resync"`
	Partial   []Partial `json:"partial"`
	Memory    Memory    `json:"memory"`
	DumpBytes int       `json:"dumpBytes"`
	// Scripts are the files holding the first full sync's nft scripts, one per family
	// (with a dump only).
	Scripts []string `json:"scripts,omitempty"`
}

// FullSync is one full sync of one instance (both families).
type FullSync struct {
	// Seconds is the whole Proxy.Sync: models, compiling, rendering, nft.
	Seconds float64 `json:"seconds"`
	// NFTSeconds is the time spent in nft processes (list and load).
	NFTSeconds float64 `json:"nftSeconds"`
	NFTCalls   int     `json:"nftCalls"`
	// Operations and Elements count the transactions' operations and set/map elements.
	Operations int `json:"operations"`
	Elements   int `json:"elements"`
	// TxBytes is the size of the nft scripts sent.
	TxBytes int `json:"txBytes,omitempty"`
}

// Partial summarizes one partial-sync scenario.
type Partial struct {
	Name        string  `json:"name"`
	Samples     int     `json:"samples"`
	MedianMS    float64 `json:"medianMs"`
	P90MS       float64 `json:"p90Ms"`
	MaxMS       float64 `json:"maxMs"`
	NFTMedianMS float64 `json:"nftMedianMs"`
	// NetlinkMedianMS is the median time in the netlink writers' transactions (encoding,
	// the round trip, the kernel's commit).
	NetlinkMedianMS float64 `json:"netlinkMedianMs"`
	// UserMedianMS and SysMedianMS are the medians of the process's user and system CPU
	// time during a sync (every thread, so the runtime's background work too); GCs
	// counts the garbage collections that finished during the samples.
	UserMedianMS float64 `json:"userMedianMs"`
	SysMedianMS  float64 `json:"sysMedianMs"`
	GCs          uint64  `json:"gcs"`
	// Operations is the median number of transaction operations.
	Operations int `json:"operations"`
	// NetlinkSyncs counts the family syncs (two per sample) written over netlink
	// (tables.NetlinkWriter) rather than by nft.
	NetlinkSyncs int `json:"netlinkSyncs"`
}

// Memory is the process's memory right after the full sync.
type Memory struct {
	// ObjectsRSSMB is the RSS with the API objects loaded, before any sync.
	ObjectsRSSMB float64 `json:"objectsRssMB"`
	RSSMB        float64 `json:"rssMB"`
	// PeakRSSMB is VmHWM: the peak RSS up to and including the full sync.
	PeakRSSMB float64 `json:"peakRssMB"`
	// HeapInuseMB is the Go heap in use after a GC.
	HeapInuseMB float64 `json:"heapInuseMB"`
	// ResyncPeakRSSMB is the peak RSS of the second full sync (the periodic one, over
	// the populated table): VmHWM reset before it.
	ResyncPeakRSSMB float64 `json:"resyncPeakRssMB,omitempty"`
	// EndPeakRSSMB is the peak RSS of the whole child (after the partial syncs).
	EndPeakRSSMB float64 `json:"endPeakRssMB,omitempty"`
}

// FloorResult is `nft -f` of the final ruleset into a fresh namespace (best of Runs).
type FloorResult struct {
	Seconds float64 `json:"seconds"`
	Runs    int     `json:"runs"`
}

// MultiResult is several instances in one process, syncing at once.
type MultiResult struct {
	Instances int `json:"instances"`
	Services  int `json:"services"`
	// WallSeconds is the time until every instance's first full sync is done.
	WallSeconds     float64   `json:"wallSeconds"`
	InstanceSeconds []float64 `json:"instanceSeconds"`
	Memory          Memory    `json:"memory"`
}

// PacketResult is the TCP connect latency through the node at one number of Services.
type PacketResult struct {
	Services int `json:"services"`
	Conns    int `json:"connections"`
	// ServiceMedianUS is the connect time to a ClusterIP (DNAT to a pod on the node).
	ServiceMedianUS float64 `json:"serviceMedianUs"`
	ServiceP90US    float64 `json:"serviceP90Us"`
	// DirectMedianUS is the connect time to the pod's own address through the same node
	// and ruleset (no DNAT): what the Service lookup adds is the difference.
	DirectMedianUS float64 `json:"directMedianUs"`
	DirectP90US    float64 `json:"directP90Us"`
}

// Check is one target of issue 6.
type Check struct {
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Target float64 `json:"target"`
	Unit   string  `json:"unit"`
	Pass   bool    `json:"pass"`
}

// UpstreamComparison compares one figure with upstream kube-proxy's.
type UpstreamComparison struct {
	Services int     `json:"services"`
	Figure   string  `json:"figure"`
	Ours     float64 `json:"ours"`
	Upstream float64 `json:"upstream"`
	Unit     string  `json:"unit"`
}
