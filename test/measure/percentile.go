package measure

import (
	"cmp"
	"slices"
)

// Percentile returns the p-th percentile (0–100) of v by the nearest-rank method: the
// smallest sample with at least p % of the samples at or below it (the zero value when v
// is empty). v need not be sorted and is not changed.
func Percentile[T cmp.Ordered](v []T, p float64) T {
	var zero T
	if len(v) == 0 {
		return zero
	}
	s := v
	if !slices.IsSorted(v) {
		s = slices.Sorted(slices.Values(v))
	}
	rank := int(ceil(p / 100 * float64(len(s)))) // 1-based
	return s[max(1, min(rank, len(s)))-1]
}

// ceil rounds x up, within float noise: 0.95 × 20 is 19.000000000000004, rank 19.
func ceil(x float64) float64 {
	const eps = 1e-9
	n := float64(int64(x))
	if x-n > eps {
		return n + 1
	}
	return n
}
