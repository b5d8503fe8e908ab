package deploy

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestDockerfile checks the Dockerfile against the rest of the repository. The image
// itself is not built here (no registry access in CI; see README.md): this keeps what
// can drift from drifting.
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(data)

	gomod, err := os.ReadFile(filepath.Join("..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goLine := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(gomod)
	goArg := regexp.MustCompile(`(?m)^ARG GO_VERSION=(\S+)$`).FindStringSubmatch(df)
	switch {
	case goLine == nil || goArg == nil:
		t.Errorf("want a go line in go.mod and ARG GO_VERSION in the Dockerfile")
	case string(goLine[1]) != goArg[1]:
		t.Errorf("the image builds with Go %s, go.mod says go %s", goArg[1], goLine[1])
	}

	build := regexp.MustCompile(`go build (?:[^\n\\]|\\\n)*`).FindString(df)
	if !strings.HasSuffix(strings.TrimSpace(build), "./cmd/shardproxy") {
		t.Errorf("the build stage does not build ./cmd/shardproxy: %q", build)
	}
	if _, err := os.Stat(filepath.Join("..", "cmd", "shardproxy", "main.go")); err != nil {
		t.Error(err)
	}

	install := regexp.MustCompile(`apt-get install [^\n&]*`).FindString(df)
	// iptables: cleanup --legacy iptables runs iptables-{nft,legacy}-{save,restore}.
	for _, pkg := range []string{"nftables", "conntrack", "iproute2", "kmod", "iptables"} {
		if !regexp.MustCompile(`\b` + pkg + `\b`).MatchString(install) {
			t.Errorf("the runtime stage does not install %s: %q", pkg, install)
		}
	}
	if !strings.Contains(df, "FROM debian:bookworm-slim") {
		t.Error("the runtime stage is not debian:bookworm-slim")
	}
	if !strings.Contains(df, `ENTRYPOINT ["/usr/local/bin/shardproxy"]`) {
		t.Error("the entrypoint is not the shardproxy binary, which the DaemonSet's args expect")
	}

	// Not root: the user the DaemonSet's runAsUser names, and CAP_NET_ADMIN as file
	// capabilities on the two programs that need it (a runtime gives a non-root process
	// none of its own).
	if users := regexp.MustCompile(`(?m)^USER (\S+)$`).FindAllStringSubmatch(df, -1); len(users) != 1 ||
		users[0][1] != fmt.Sprintf("%d:%d", imageUID, imageUID) {
		t.Errorf("USER lines %q, want one: USER %d:%d", users, imageUID, imageUID)
	}
	// Exactly those two: no iptables binary (xtables-nft-multi serves every applet
	// whatever its file is named; the supervisor passes its capability to
	// iptables-nft-save, legacy/caps.go), and nothing else.
	var caps []string
	for _, m := range regexp.MustCompile(`setcap (\S+) (\S+)`).FindAllStringSubmatch(df, -1) {
		caps = append(caps, m[1]+" "+m[2])
	}
	if want := []string{"cap_net_admin=ep /usr/local/bin/shardproxy", "cap_net_admin=ep /usr/sbin/nft"}; !slices.Equal(caps, want) {
		t.Errorf("the image gives file capabilities %q, want exactly %q", caps, want)
	}
	if u, s := strings.Index(df, "\nUSER "), strings.LastIndex(df, "setcap "); u < s {
		t.Error("USER comes before setcap: setcap needs root at build time")
	}
}

// TestInitContainerScript checks that the replace overlay's conntrack-sysctls script
// parses, uses only commands the image has, and that the supervisor container passes
// arguments to the image's entrypoint rather than replacing it; and that the init
// container, privileged and root because the writes need both (the YAML says why),
// has nothing else: no host path (nf_conntrack is loaded by the kernel for an nft rule,
// not by modprobe from a mounted /lib/modules), a read-only root file system.
func TestInitContainerScript(t *testing.T) {
	objs := render(t, "overlays/replace-kube-proxy")
	ds := only[appsv1.DaemonSet](t, objs, "DaemonSet")
	pod := ds.Spec.Template.Spec
	if len(pod.Containers[0].Command) != 0 {
		t.Errorf("the supervisor container sets command %q: the image's entrypoint is shardproxy", pod.Containers[0].Command)
	}
	if len(pod.InitContainers) != 1 {
		t.Fatalf("%d init containers, want conntrack-sysctls", len(pod.InitContainers))
	}
	ic := pod.InitContainers[0]
	if ic.Image != pod.Containers[0].Image {
		t.Errorf("init container image %q, supervisor image %q: the script relies on the shardproxy image's tools", ic.Image, pod.Containers[0].Image)
	}
	script := initScript(t, ic)
	if out, err := exec.Command("sh", "-n", "-c", script).CombinedOutput(); err != nil {
		t.Errorf("the init script does not parse: %v\n%s", err, out)
	}
	// nft comes from nftables, nproc and cat from coreutils (in every Debian image).
	for _, cmd := range []string{"nft -f -", "nproc"} {
		if !strings.Contains(script, cmd) {
			t.Errorf("the script no longer uses %s: update this test and the Dockerfile's packages", cmd)
		}
	}
	if regexp.MustCompile(`(?m)^[^#]*\bmodprobe\b`).MatchString(script) {
		t.Error("the script runs modprobe: the kernel loads nf_conntrack for an nft rule, with no /lib/modules mount")
	}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			t.Errorf("volume %s mounts host path %s: the pod needs none", v.Name, v.HostPath.Path)
		}
	}
	if len(ic.VolumeMounts) != 0 {
		t.Errorf("the init container mounts %v, want nothing", ic.VolumeMounts)
	}
	sc := ic.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("the init container's root file system is writable: it writes nothing of its own")
	}
}

// initScript returns the replace overlay's init container's script (sh -ec SCRIPT).
func initScript(t *testing.T, ic corev1.Container) string {
	t.Helper()
	if len(ic.Command) != 3 || ic.Command[0] != "/bin/sh" || ic.Command[1] != "-ec" {
		t.Fatalf("init container command %q, want /bin/sh -ec SCRIPT", ic.Command)
	}
	return ic.Command[2]
}

// TestInitContainerScriptWrites runs the replace overlay's init script on files of its
// own (the real ones are the node's) with a fake nft on $PATH that, as the kernel does
// for a conntrack rule, loads nf_conntrack: its values appear. It writes kube-proxy's
// values where they differ, nothing (and loads nothing) where they are already set, and
// never fails the pod.
func TestInitContainerScriptWrites(t *testing.T) {
	objs := render(t, "overlays/replace-kube-proxy")
	script := initScript(t, only[appsv1.DaemonSet](t, objs, "DaemonSet").Spec.Template.Spec.InitContainers[0])
	// Run as root, a script that ignored these would write this machine's sysctls.
	for _, v := range []string{"${NF_SYSCTLS:-/proc/sys/net/netfilter}", "${NF_HASHSIZE:-/sys/module/nf_conntrack/parameters/hashsize}"} {
		if !strings.Contains(script, v) {
			t.Fatalf("the script does not take %s: not running it", v)
		}
	}
	out, err := exec.Command("nproc").Output()
	if err != nil {
		t.Fatal(err)
	}
	cpus, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	// kube-proxy v1.36's getConntrackMax: 32768 per CPU, at least 131072, at most 1048576.
	max := min(max(32768*cpus, 131072), 1048576)
	want := map[string]string{"nf_conntrack_max": strconv.Itoa(max), "nf_conntrack_tcp_timeout_established": "86400",
		"nf_conntrack_tcp_timeout_close_wait": "3600", "hashsize": strconv.Itoa(max / 4)}
	// On 64 CPUs kube-proxy writes the cap, not 32768 × 64 = 2097152.
	want64 := with(with(want, "nf_conntrack_max", "1048576"), "hashsize", "262144")
	kernelDefaults := map[string]string{"nf_conntrack_max": "65536", "nf_conntrack_tcp_timeout_established": "432000",
		"nf_conntrack_tcp_timeout_close_wait": "60", "hashsize": "16384"}

	for _, tc := range []struct {
		name     string
		before   map[string]string // nil: nf_conntrack is not loaded
		loadable bool              // the fake nft loads it
		nproc    string            // what a fake nproc says; "": the machine's
		want     map[string]string // nil: no value exists after
		wantNFT  bool
		wantOut  []string
	}{
		{name: "already set: nothing written, nothing loaded", before: want, want: want,
			wantOut: []string{"conntrack sysctls already set; nothing written"}},
		{name: "the kernel's defaults: kube-proxy's written", before: kernelDefaults, want: want,
			wantOut: []string{"nf_conntrack_max = " + want["nf_conntrack_max"] + " (was 65536)", "hashsize = " + want["hashsize"]}},
		{name: "64 CPUs: kube-proxy's cap, 1048576", before: kernelDefaults, nproc: "64", want: want64,
			wantOut: []string{"nf_conntrack_max = 1048576 (was 65536)", "hashsize = 262144"}},
		{name: "a larger hash table is kept", before: with(want, "hashsize", strconv.Itoa(max)), want: with(want, "hashsize", strconv.Itoa(max)),
			wantOut: []string{"already set"}},
		{name: "only the value that differs is written", before: with(want, "nf_conntrack_tcp_timeout_close_wait", "60"), want: want,
			wantOut: []string{"nf_conntrack_tcp_timeout_close_wait = 3600 (was 60)"}},
		{name: "not loaded: the kernel loads it for an nft rule, then the values are written", loadable: true, want: want, wantNFT: true},
		{name: "not loadable: reported, the pod goes on", wantNFT: true,
			wantOut: []string{"loading nf_conntrack through nft failed; continuing", "could not write"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			nf := filepath.Join(dir, "proc-sys-net-netfilter")
			hashsize := filepath.Join(dir, "hashsize")
			files := map[string]string{"hashsize": hashsize}
			for _, k := range []string{"nf_conntrack_max", "nf_conntrack_tcp_timeout_established", "nf_conntrack_tcp_timeout_close_wait"} {
				files[k] = filepath.Join(nf, k)
			}
			write := func(values map[string]string) string {
				var b strings.Builder
				for k, v := range values {
					fmt.Fprintf(&b, "echo %s >%s\n", v, files[k])
				}
				return b.String()
			}
			if tc.before != nil {
				if err := os.Mkdir(nf, 0o755); err != nil {
					t.Fatal(err)
				}
				if out, err := exec.Command("sh", "-ec", write(tc.before)).CombinedOutput(); err != nil {
					t.Fatalf("%v: %s", err, out)
				}
			}
			bin := filepath.Join(dir, "bin")
			nftLog := filepath.Join(dir, "nft.log")
			load := "exit 1"
			if tc.loadable {
				load = "mkdir -p " + nf + "\n" + write(kernelDefaults)
			}
			fakeNFT := "#!/bin/sh\ncat >>" + nftLog + "\n" + load + "\n"
			if err := os.Mkdir(bin, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(bin, "nft"), []byte(fakeNFT), 0o755); err != nil {
				t.Fatal(err)
			}
			if tc.nproc != "" {
				if err := os.WriteFile(filepath.Join(bin, "nproc"), []byte("#!/bin/sh\necho "+tc.nproc+"\n"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command("/bin/sh", "-ec", script)
			cmd.Env = []string{"PATH=" + bin + ":/usr/sbin:/usr/bin:/sbin:/bin", "NF_SYSCTLS=" + nf, "NF_HASHSIZE=" + hashsize}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("the script failed (the pod would not start): %v\n%s", err, out)
			}
			for _, w := range tc.wantOut {
				if !strings.Contains(string(out), w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for k, path := range files {
				data, err := os.ReadFile(path)
				got := strings.TrimSpace(string(data))
				if tc.want == nil && err == nil || tc.want != nil && got != tc.want[k] {
					t.Errorf("%s = %q (%v), want %q\n%s", k, got, err, tc.want[k], out)
				}
			}
			rules, err := os.ReadFile(nftLog)
			if ran := err == nil; ran != tc.wantNFT {
				t.Errorf("nft ran: %v, want %v", ran, tc.wantNFT)
			}
			if tc.wantNFT && !strings.Contains(string(rules), " ct state ") || strings.Contains(string(rules), "add table") && !strings.Contains(string(rules), "delete table ip shardproxy-load-conntrack") {
				t.Errorf("nft was given %q, want one transaction with a conntrack rule that removes its table", rules)
			}
		})
	}
}

// with returns a copy of m with k set to v.
func with(m map[string]string, k, v string) map[string]string {
	out := maps.Clone(m)
	out[k] = v
	return out
}

// TestMakeImageMatchesDockerfile keeps `make image` (hack/build-image.sh, which builds the
// image offline for the cluster layer's node) in step with the Dockerfile users build:
// the same Debian packages, build flags, file capabilities, user and entrypoint.
func TestMakeImageMatchesDockerfile(t *testing.T) {
	df, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join("..", "hack", "build-image.sh"))
	if err != nil {
		t.Fatal(err)
	}
	shVar := func(name string) string {
		m := regexp.MustCompile(`(?m)^` + name + `=(.*)$`).FindSubmatch(script)
		if m == nil {
			t.Fatalf("hack/build-image.sh sets no %s", name)
		}
		return strings.Trim(string(m[1]), `()"`)
	}
	sorted := func(s []string) string {
		s = slices.Clone(s)
		slices.Sort(s)
		return strings.Join(s, " ")
	}

	install := strings.Fields(regexp.MustCompile(`apt-get install -y --no-install-recommends ([^\n&]*)`).FindStringSubmatch(string(df))[1])
	// libcap2-bin only runs setcap in the Dockerfile and is purged again; the script runs
	// the host's setcap on the root filesystem instead.
	install = slices.DeleteFunc(install, func(p string) bool { return p == "libcap2-bin" || p == `\` })
	if got, want := sorted(strings.Fields(shVar("shardproxy_packages"))), sorted(install); got != want {
		t.Errorf("make image installs %q, the Dockerfile %q", got, want)
	}

	entry := regexp.MustCompile(`(?m)^ENTRYPOINT \["([^"]+)"\]$`).FindStringSubmatch(string(df))
	if entry == nil || shVar("shardproxy_entrypoint") != entry[1] {
		t.Errorf("make image's entrypoint %q, the Dockerfile's %v", shVar("shardproxy_entrypoint"), entry)
	}
	user := regexp.MustCompile(`(?m)^USER (\S+)$`).FindStringSubmatch(string(df))
	if user == nil || shVar("shardproxy_user") != user[1] {
		t.Errorf("make image's user %q, the Dockerfile's %v", shVar("shardproxy_user"), user)
	}
	var caps []string
	for _, m := range regexp.MustCompile(`setcap cap_net_admin=ep (\S+)`).FindAllStringSubmatch(string(df), -1) {
		caps = append(caps, m[1])
	}
	if got, want := sorted(strings.Fields(shVar("shardproxy_caps"))), sorted(caps); got != want {
		t.Errorf("make image gives cap_net_admin to %q, the Dockerfile to %q", got, want)
	}

	ldflags := regexp.MustCompile(`-ldflags "([^"]*)"`).FindStringSubmatch(string(df))
	if ldflags == nil || strings.ReplaceAll(ldflags[1], "${VERSION:-$(cat VERSION)}", "${tag}") != shVar("shardproxy_ldflags") {
		t.Errorf("make image's ldflags %q, the Dockerfile's %v", shVar("shardproxy_ldflags"), ldflags)
	}
	for _, flag := range []string{"CGO_ENABLED=0", "-trimpath", "-buildvcs=false", "./cmd/shardproxy"} {
		if !strings.Contains(string(df), flag) || !strings.Contains(string(script), flag) {
			t.Errorf("%s is not in both the Dockerfile's and make image's build", flag)
		}
	}
	if !strings.Contains(string(df), "debian:bookworm-slim") || shVar("suite") != "bookworm" {
		t.Errorf("the Dockerfile and make image build on different Debian releases (suite=%s)", shVar("suite"))
	}
}
