package tables

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// TableName is the name of an instance's tables, the same in both families:
// "<prefix>-<instance>". It is the one place that spells the name; InstanceOfTable reads
// it back.
func TableName(prefix, instance string) string {
	return prefix + "-" + instance
}

// InstanceOfTable is the inverse of TableName: the instance a table named table belongs
// to under prefix, and whether the name has that prefix at all. The instance part is
// returned as it is; whether it is a valid instance name is for the caller to decide.
func InstanceOfTable(prefix, table string) (instance string, ok bool) {
	return strings.CutPrefix(table, prefix+"-")
}

// KnftFamily is the knftables family of a table family.
func KnftFamily(f Family) knftables.Family {
	if f == IPv6 {
		return knftables.IPv6Family
	}
	return knftables.IPv4Family
}

// NewNFT opens one nftables table of the host (of the network namespace the process is
// in) through knftables: the one constructor every real instance, probe, cleanup and
// benchmark uses. The constructor checks that nft is installed and new enough. Listing
// goes over netlink (knftables.UseNetlink) rather than through `nft list`, which would
// print and parse the whole table.
//
// Its transactions are written to nft as they are rendered (ScriptRunner): knftables'
// Run renders a whole transaction into a buffer first, and keeps that buffer for the
// next one, which at a full sync of 10,000s of Services is tens of MB at the peak and
// for good.
func NewNFT(fam Family, table string) (knftables.Interface, error) {
	nft, err := knftables.New(KnftFamily(fam), table, knftables.UseNetlink)
	if err != nil {
		return nil, fmt.Errorf("nftables for table %s %s: %w", KnftFamily(fam), table, err)
	}
	path, err := exec.LookPath("nft")
	if err != nil {
		return nil, fmt.Errorf("nftables for table %s %s: %w", KnftFamily(fam), table, err)
	}
	return &scriptNFT{Interface: nft, path: path}, nil
}

// ScriptRunner is a knftables.Interface that can also run an nft script as it is being
// written.
type ScriptRunner interface {
	knftables.Interface
	// RunScript runs `nft -f -` (check: `nft --check -f -`) on what write writes, as one
	// transaction: if write fails, nft runs none of it.
	RunScript(ctx context.Context, check bool, write func(io.Writer) error) error
}

// scriptNFT is knftables' nft with RunScript.
type scriptNFT struct {
	knftables.Interface
	path string
}

var _ ScriptRunner = &scriptNFT{}

// RunScript implements ScriptRunner.
func (n *scriptNFT) RunScript(ctx context.Context, check bool, write func(io.Writer) error) error {
	args := []string{"-f", "-"}
	if check {
		args = append([]string{"--check"}, args...)
	}
	cmd := exec.CommandContext(ctx, n.path, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fmt.Errorf("running nft: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("running nft: %w", err)
	}
	bw := bufio.NewWriterSize(stdin, 64<<10)
	werr := write(bw)
	if werr == nil {
		werr = bw.Flush()
	}
	if werr != nil {
		// nft reads its whole input before it commits anything: killed before the end
		// of a script cut short, it commits none of it.
		_ = cmd.Process.Kill()
	}
	_ = stdin.Close()
	err = cmd.Wait()
	switch {
	case werr != nil && out.Len() > 0: // nft stopped reading: it said why
		return fmt.Errorf("nft: %s (writing the script: %v)", strings.TrimSpace(out.String()), werr)
	case werr != nil:
		return fmt.Errorf("writing the nft script: %w", werr)
	case err != nil:
		return fmt.Errorf("nft: %w: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}

// OwnerComment is the comment shardproxy writes on each table of an instance, its
// ownership marker: "shardproxy instance <instance> supervisor <supervisor>". Only a
// table carrying it is ever deleted as a removed instance's, and only by the supervisor
// it names: a name alone ("<prefix>-<name>") can be anyone's, and two supervisors on a
// node may share a prefix. An empty supervisor gives the marker of earlier versions,
// "shardproxy instance <instance>".
func OwnerComment(instance, supervisor string) string {
	if supervisor == "" {
		return ownerCommentStart + instance
	}
	return ownerCommentStart + instance + ownerSupervisor + supervisor
}

// ownerCommentStart and ownerSupervisor are OwnerComment's fixed words.
const (
	ownerCommentStart = "shardproxy instance "
	ownerSupervisor   = " supervisor "
)

// ListedTable is one nftables table as ListTables finds it.
type ListedTable struct {
	// Name is the table's name.
	Name string
	// Comment is the table's comment; empty when it has none.
	Comment string
}

// Owner is the instance and supervisor whose table t is under prefix: its name is
// TableName(prefix, instance) and its comment OwnerComment(instance, supervisor);
// supervisor is "" for an earlier version's marker, which names none. A table with a
// matching name but without such a comment is someone else's (another component's table
// under a prefix that happens to match, or one written by hand) and yields false.
func (t ListedTable) Owner(prefix string) (instance, supervisor string, ok bool) {
	instance, ok = InstanceOfTable(prefix, t.Name)
	if !ok {
		return "", "", false
	}
	rest, ok := strings.CutPrefix(t.Comment, ownerCommentStart+instance)
	switch {
	case !ok:
		return "", "", false
	case rest == "":
		return instance, "", true
	}
	supervisor, ok = strings.CutPrefix(rest, ownerSupervisor)
	if !ok || supervisor == "" {
		return "", "", false
	}
	return instance, supervisor, true
}

// OwnedInstance is the instance whose table t is under prefix, whichever supervisor's
// (Owner): what `shardproxy cleanup` may delete, since it removes everything shardproxy
// made.
func (t ListedTable) OwnedInstance(prefix string) (instance string, ok bool) {
	instance, _, ok = t.Owner(prefix)
	return instance, ok
}

// Netlink numbers of the table dump that ListTables asks for (linux/netfilter and
// linux/netfilter/nf_tables.h), and libnftnl's user data type of a table comment.
const (
	nftMsgGetTable         = unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETTABLE
	nftMsgNewTable         = unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWTABLE
	nftaTableUserdata      = 0x6 // NFTA_TABLE_USERDATA; x/sys/unix does not name it
	nftnlUdataTableComment = 0   // NFTNL_UDATA_TABLE_COMMENT
)

// ListTables lists the nftables tables of one family in this network namespace, with
// their comments. knftables works on one known table only, so this asks the kernel over
// netlink; `nft list tables` would read every rule and element of every table first
// (seconds on a node with 10,000 Services), and google/nftables does not return table
// comments.
func ListTables(_ context.Context, fam Family) ([]ListedTable, error) {
	family := byte(unix.NFPROTO_IPV4)
	if fam == IPv6 {
		family = unix.NFPROTO_IPV6
	}
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, fmt.Errorf("listing %s tables: %w", KnftFamily(fam), err)
	}
	defer conn.Close()
	replies, err := conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(nftMsgGetTable), Flags: netlink.Request | netlink.Dump},
		// struct nfgenmsg: family, version, resource id (big endian, 0).
		Data: []byte{family, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return nil, fmt.Errorf("listing %s tables: %w", KnftFamily(fam), err)
	}
	out := make([]ListedTable, 0, len(replies))
	for _, m := range replies {
		if m.Header.Type != netlink.HeaderType(nftMsgNewTable) {
			continue
		}
		t, err := parseTable(m.Data)
		if err != nil {
			return nil, fmt.Errorf("listing %s tables: %w", KnftFamily(fam), err)
		}
		out = append(out, t)
	}
	return out, nil
}

// parseTable decodes one NFT_MSG_NEWTABLE payload: the nfgenmsg header, then attributes.
func parseTable(data []byte) (ListedTable, error) {
	if len(data) < 4 {
		return ListedTable{}, fmt.Errorf("table message of %d bytes", len(data))
	}
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return ListedTable{}, fmt.Errorf("decoding table attributes: %w", err)
	}
	var t ListedTable
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_TABLE_NAME:
			t.Name = ad.String()
		case nftaTableUserdata:
			t.Comment = udataComment(ad.Bytes())
		}
	}
	if err := ad.Err(); err != nil {
		return ListedTable{}, fmt.Errorf("decoding table attributes: %w", err)
	}
	return t, nil
}

// udataComment returns the comment in a table's user data, libnftnl's type-length-value
// records, or "" if there is none. User data is whatever the table's writer put there, so
// a malformed record ends the search rather than being trusted.
func udataComment(udata []byte) string {
	for len(udata) >= 2 {
		typ, n := udata[0], int(udata[1])
		if len(udata) < 2+n {
			return ""
		}
		if typ == nftnlUdataTableComment {
			return strings.TrimRight(string(udata[2:2+n]), "\x00")
		}
		udata = udata[2+n:]
	}
	return ""
}
