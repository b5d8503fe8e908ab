package tables

import (
	"fmt"
	"strconv"

	"sigs.k8s.io/knftables"
)

// MaxSlots is the number of instances one node can run side by side: each slot owns one
// priority in each band below.
const MaxSlots = 32

// Priority bands. Netfilter runs every nat-type chain from its own NAT hook, at dstnat
// (-100) on prerouting and output and at srcnat (100) on postrouting; a nat chain's
// priority only orders it among the other nat chains. Upstream kube-proxy (and
// iptables-nft) DNAT at exactly dstnat and masquerade at srcnat, so every instance's nat
// chains, numbered after theirs, run after theirs: during a migration a legacy proxy wins
// any overlap. The firewall must see Service addresses, so it runs before the NAT hook;
// the filter chains see translated traffic:
//
//	band       hooks                      priorities (slot 0 .. 31)
//	firewall   prerouting, output         -132 .. -101  (before any DNAT)
//	dnat       prerouting, output         -67 .. -36    (type nat: ordered after -100)
//	filter     input, forward, output     -35 .. -4
//	snat       postrouting                101 .. 132    (type nat: ordered after 100)
//
// No two slots share a priority on any hook, and no band overlaps another.
const (
	firewallBase = -100 - MaxSlots
	dnatBase     = -100 + 1 + MaxSlots
	filterBase   = dnatBase + MaxSlots
	snatBase     = 100 + 1
)

// Priorities are the base-chain priorities of one slot.
type Priorities struct {
	Firewall, DNAT, Filter, SNAT int
}

// PrioritiesFor returns the priorities of a slot, or an error if the slot is out of range.
func PrioritiesFor(slot int) (Priorities, error) {
	if slot < 0 || slot >= MaxSlots {
		return Priorities{}, fmt.Errorf("slot %d is out of range [0, %d)", slot, MaxSlots)
	}
	return Priorities{
		Firewall: firewallBase + slot,
		DNAT:     dnatBase + slot,
		Filter:   filterBase + slot,
		SNAT:     snatBase + slot,
	}, nil
}

// baseChain is one hooked chain of the table.
type baseChain struct {
	name     string
	typ      knftables.BaseChainType
	hook     knftables.BaseChainHook
	priority int
}

// baseChains lists the instance's base chains with their hooks and priorities.
func baseChains(p Priorities) []baseChain {
	return []baseChain{
		{chainFirewallPrerouting, knftables.FilterType, knftables.PreroutingHook, p.Firewall},
		{chainFirewallOutput, knftables.FilterType, knftables.OutputHook, p.Firewall},
		{chainNATPrerouting, knftables.NATType, knftables.PreroutingHook, p.DNAT},
		{chainNATOutput, knftables.NATType, knftables.OutputHook, p.DNAT},
		{chainFilterInput, knftables.FilterType, knftables.InputHook, p.Filter},
		{chainFilterForward, knftables.FilterType, knftables.ForwardHook, p.Filter},
		{chainFilterOutput, knftables.FilterType, knftables.OutputHook, p.Filter},
		{chainNATPostrouting, knftables.NATType, knftables.PostroutingHook, p.SNAT},
	}
}

func (b baseChain) chain() *knftables.Chain {
	prio := knftables.BaseChainPriority(strconv.Itoa(b.priority))
	return &knftables.Chain{
		Name:     b.name,
		Type:     &b.typ,
		Hook:     &b.hook,
		Priority: &prio,
	}
}
