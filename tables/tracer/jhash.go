package tracer

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
)

// JHashMod is what the kernel's "jhash <addr> mod n seed seed" expression yields for the
// address (nft_jhash_eval): Bob Jenkins' lookup3 hash as include/linux/jhash.h computes
// it over the address bytes in network order, scaled into 0..n-1 by multiplication
// (reciprocal_scale), not by a remainder.
func JHashMod(addr netip.Addr, seed, n uint32) uint32 {
	var data []byte
	if addr.Is4() {
		a := addr.As4()
		data = a[:]
	} else {
		a := addr.As16()
		data = a[:]
	}
	return uint32((uint64(jhash(data, seed)) * uint64(n)) >> 32)
}

// jhash is the kernel's jhash(key, length, initval). Words are read in the CPU's byte
// order (__get_unaligned_cpu32); the machines this models are little-endian (x86, arm64).
func jhash(k []byte, seed uint32) uint32 {
	a := 0xdeadbeef + uint32(len(k)) + seed
	b, c := a, a
	for len(k) > 12 {
		a += binary.LittleEndian.Uint32(k[0:])
		b += binary.LittleEndian.Uint32(k[4:])
		c += binary.LittleEndian.Uint32(k[8:])
		a, b, c = jhashMix(a, b, c)
		k = k[12:]
	}
	if len(k) == 0 {
		return c
	}
	// The tail, byte by byte (the kernel's fall-through switch).
	var tail [12]byte
	copy(tail[:], k)
	a += binary.LittleEndian.Uint32(tail[0:])
	b += binary.LittleEndian.Uint32(tail[4:])
	c += binary.LittleEndian.Uint32(tail[8:])
	_, _, c = jhashFinal(a, b, c)
	return c
}

// jhashMix is the kernel's __jhash_mix: six rounds of jhashRound, each word in turn.
func jhashMix(a, b, c uint32) (uint32, uint32, uint32) {
	a, c = jhashRound(a, b, c, 4)
	b, a = jhashRound(b, c, a, 6)
	c, b = jhashRound(c, a, b, 8)
	a, c = jhashRound(a, b, c, 16)
	b, a = jhashRound(b, c, a, 19)
	c, b = jhashRound(c, a, b, 4)
	return a, b, c
}

// jhashRound is one round of __jhash_mix: x -= z; x ^= rol32(z, r); z += y. It returns
// the new x and z.
func jhashRound(x, y, z uint32, r int) (uint32, uint32) {
	x -= z
	x ^= bits.RotateLeft32(z, r)
	return x, z + y
}

// jhashFinal is the kernel's __jhash_final: seven steps of x ^= y; x -= rol32(y, r).
func jhashFinal(a, b, c uint32) (uint32, uint32, uint32) {
	c = jhashFinalStep(c, b, 14)
	a = jhashFinalStep(a, c, 11)
	b = jhashFinalStep(b, a, 25)
	c = jhashFinalStep(c, b, 16)
	a = jhashFinalStep(a, c, 4)
	b = jhashFinalStep(b, a, 14)
	c = jhashFinalStep(c, b, 24)
	return a, b, c
}

func jhashFinalStep(x, y uint32, r int) uint32 {
	return (x ^ y) - bits.RotateLeft32(y, r)
}
