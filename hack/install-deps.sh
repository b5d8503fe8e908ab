#!/usr/bin/env bash
# install-deps.sh installs the host tools the tests, the e2e suite and the proxy use, on
# Debian, as root: nftables (nft), conntrack, etcd-server (etcd), iproute2 (ip) and iptables
# (the nft backend: the coexistence e2e runs upstream kube-proxy in iptables mode), and
# libcap2-bin (setcap: the non-root test gives the binaries file capabilities), and for the
# cluster layer's real node (test/cluster): containerd, runc, the CNI plugins
# (containernetworking-plugins), and mmdebstrap and umoci, which build its images offline
# (hack/build-image.sh); for the kernel layers (hack/kernels.sh): qemu-system-x86 (the
# VMs), cpio (their initramfs) and kmod (depmod for the kernel packages' modules). The
# packaged containerd service is not started (policy-rc.d below; test/cluster runs its
# own containerd with its own paths). Only
# missing tools are installed and `apt-get update` runs at most once, so running it again
# is cheap.
#
# The etcd-server package starts an etcd service on the default ports. We never use it
# (the test control plane runs its own etcd on free ports with a temporary data dir), so it
# is stopped and disabled to keep port 2379 and the CPU free.
set -euo pipefail

declare -A pkg_for=(
	[nft]=nftables
	[conntrack]=conntrack
	[etcd]=etcd-server
	[ip]=iproute2
	[iptables]=iptables
	[setcap]=libcap2-bin
	[containerd]=containerd
	[runc]=runc
	[/usr/lib/cni/bridge]=containernetworking-plugins
	[mmdebstrap]=mmdebstrap
	[umoci]=umoci
	[qemu-system-x86_64]=qemu-system-x86
	[cpio]=cpio
	[depmod]=kmod
	[zsh]=zsh
	[fish]=fish
)

missing=()
for cmd in nft conntrack etcd ip iptables setcap containerd runc /usr/lib/cni/bridge mmdebstrap umoci qemu-system-x86_64 cpio depmod zsh fish; do
	if ! PATH="${PATH}:/usr/sbin:/sbin" command -v "${cmd}" >/dev/null 2>&1; then
		missing+=("${pkg_for[${cmd}]}")
	fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
	echo "install-deps: nothing to install"
	exit 0
fi

if [[ ${EUID} -ne 0 ]]; then
	echo "install-deps: need root to install: ${missing[*]}" >&2
	exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# policy-rc.d exit 101 tells invoke-rc.d not to start services while we install, so the
# packaged etcd does not start (on machines without systemd there is nothing else to stop).
policy=/usr/sbin/policy-rc.d
added_policy=false
if [[ ! -e "${policy}" ]]; then
	printf '#!/bin/sh\nexit 101\n' >"${policy}"
	chmod +x "${policy}"
	added_policy=true
fi
trap 'if ${added_policy}; then rm -f "${policy}"; fi' EXIT
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

if [[ " ${missing[*]} " == *" etcd-server "* ]] && command -v systemctl >/dev/null 2>&1 &&
	[[ -d /run/systemd/system ]]; then
	systemctl disable --now etcd.service >/dev/null 2>&1 || true
fi
if [[ " ${missing[*]} " == *" containerd "* ]] && command -v systemctl >/dev/null 2>&1 &&
	[[ -d /run/systemd/system ]]; then
	systemctl disable --now containerd.service >/dev/null 2>&1 || true
fi
echo "install-deps: done"
