package tables

import (
	"fmt"
	"testing"
)

func TestPrioritiesDistinctAndOrdered(t *testing.T) {
	seen := map[string]int{} // "hook/priority" -> slot
	for slot := 0; slot < MaxSlots; slot++ {
		p, err := PrioritiesFor(slot)
		if err != nil {
			t.Fatalf("slot %d: %v", slot, err)
		}
		if !(p.Firewall < p.DNAT && p.DNAT < p.Filter && p.Filter < p.SNAT) {
			t.Errorf("slot %d: want firewall < DNAT < filter < SNAT, got %+v", slot, p)
		}
		if p.DNAT <= -100 {
			t.Errorf("slot %d: nat chains must be ordered after a legacy proxy's dstnat (-100): %+v", slot, p)
		}
		if p.Firewall >= -100 {
			t.Errorf("slot %d: the firewall must run before the NAT hook at -100: %+v", slot, p)
		}
		if p.DNAT <= -200 || p.SNAT <= 100 {
			t.Errorf("slot %d: nat chains must stay after conntrack and after srcnat: %+v", slot, p)
		}
		if p.Filter >= 0 {
			t.Errorf("slot %d: filter chains should run before the default filter priority: %+v", slot, p)
		}
		for _, b := range baseChains(p) {
			key := fmt.Sprintf("%s/%d", b.hook, b.priority)
			if other, dup := seen[key]; dup && other != slot {
				t.Errorf("slot %d and slot %d share priority %d on hook %s", slot, other, b.priority, b.hook)
			}
			seen[key] = slot
		}
	}
	for _, bad := range []int{-1, MaxSlots} {
		if _, err := PrioritiesFor(bad); err == nil {
			t.Errorf("slot %d: want an error", bad)
		}
	}
}
