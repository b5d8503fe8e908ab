# cache.sh is sourced by the scripts that build tools into the shared cache
# (${SHARDPROXY_CACHE:-$HOME/.cache/shardproxy}/bin: build-apiserver.sh, build-helm.sh).
# It holds what they share besides their recipes: the key, the build lock, the install and
# the pruning. Its text is not part of any key: editing it rebuilds nothing. A script's
# key hashes its recipe functions as bash prints them (`declare -f`: code only, comments
# dropped), so editing a script's comments, usage or plumbing rebuilds nothing either,
# while any change to what a build runs does.

# A key is computed inside command substitutions ($(...)), where bash drops `set -e`
# unless told to keep it: without this, a failing `go env` would leave a key computed
# without the toolchain instead of stopping the build.
shopt -s inherit_errexit

# cache_recipe_hash FUNC... prints the code of the named functions, the Go toolchain and
# the go env settings that change a build's output, for a key's hash input. Run it in the
# directory whose go.mod selects the toolchain.
cache_recipe_hash() {
	declare -f "$@"
	go env GOVERSION GOOS GOARCH GOAMD64 GOARM64 GOFLAGS GOEXPERIMENT
}

# cache_key reads a key's input on stdin and prints the key (16 hex digits).
cache_key() {
	sha256sum | cut -c1-16
}

# cache_all_there PATH... succeeds when every path is an executable, touching them so that
# pruning sees them in use.
cache_all_there() {
	local path ok=0
	for path in "$@"; do
		if [[ -x "${path}" ]]; then
			touch -c "${path}"
		else
			ok=1
		fi
	done
	return "${ok}"
}

# cache_lock WHO BINDIR serializes builds into BINDIR on file descriptor 9: tests in
# several packages may ask for a binary at once, and the second should wait and then
# find it, not build it again. The lock is released when the script exits.
cache_lock() {
	local who="$1" bindir="$2"
	mkdir -p "${bindir}"
	exec 9>"${bindir}/.build.lock"
	if ! flock -n 9; then
		echo "${who}: another build is running, waiting for it"
		flock 9
	fi
}

# cache_prune WHO BINDIR KEEP NAME removes NAME's binaries of other keys that nobody used
# for a week (cached as NAME-vVERSION-KEY), never KEEP.
cache_prune() {
	local who="$1" bindir="$2" keep="$3" name="$4"
	find "${bindir}" -maxdepth 1 -regextype posix-extended -type f ! -path "${keep}" -mtime +6 \
		-regex ".*/${name//./\\.}-v[^/-]+-[0-9a-f]{16}" -print -delete |
		sed "s/^/${who}: removed unused /"
}
