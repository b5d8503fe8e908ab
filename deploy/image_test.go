package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
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
// arguments to the image's entrypoint rather than replacing it.
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
	if len(ic.Command) != 3 || ic.Command[0] != "/bin/sh" {
		t.Fatalf("init container command %q, want /bin/sh -ec SCRIPT", ic.Command)
	}
	script := ic.Command[2]
	if out, err := exec.Command("sh", "-n", "-c", script).CombinedOutput(); err != nil {
		t.Errorf("the init script does not parse: %v\n%s", err, out)
	}
	// modprobe comes from kmod, nproc and cat from coreutils (in every Debian image).
	for _, cmd := range []string{"modprobe", "nproc"} {
		if !strings.Contains(script, cmd) {
			t.Errorf("the script no longer uses %s: update this test and the Dockerfile's packages", cmd)
		}
	}
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
