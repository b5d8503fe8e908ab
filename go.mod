module github.com/shardproxy/shardproxy

go 1.26.8

require (
	github.com/go-logr/logr v1.4.1 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/google/nftables v0.3.0 // indirect
	github.com/mdlayher/netlink v1.11.2 // indirect
	github.com/mdlayher/socket v0.6.1 // indirect
	golang.org/x/net v0.57.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	k8s.io/klog/v2 v2.140.0 // indirect
	sigs.k8s.io/knftables v0.0.22 // indirect
)
