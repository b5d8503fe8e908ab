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

func jhashMix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= bits.RotateLeft32(c, 4)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 6)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 8)
	b += a
	a -= c
	a ^= bits.RotateLeft32(c, 16)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 19)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 4)
	b += a
	return a, b, c
}

func jhashFinal(a, b, c uint32) (uint32, uint32, uint32) {
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return a, b, c
}
