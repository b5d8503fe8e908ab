// Package measure holds what the benchmarks, the soak and the fleet harness read off
// processes (/proc: CPU time, resident and proportional set sizes) and how they
// summarize samples (nearest-rank percentiles), so that every figure in the docs is
// computed one way.
package measure
