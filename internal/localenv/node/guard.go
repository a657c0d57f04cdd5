package node

import (
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// guardTable is the nft table of the network guard.
const guardTable = "kbb_node_guard"

// guardRules keep every packet of the node's address ranges on this
// machine: nothing to the pod, Service or node ranges and nothing from the
// pod range may leave through any interface but the node's bridge and
// loopback. The postrouting hook sees locally sent packets after
// kube-proxy's DNAT (the output hook would drop host-to-ClusterIP traffic
// before it) and before any masquerade; the forward hook keeps what pods
// send on the bridge. Each rule counts what it drops: a non-zero counter
// means something tried to leave.
func guardRules() string {
	ranges := strings.Join([]string{PodCIDR, ServiceCIDR}, ", ")
	local := fmt.Sprintf(`{ "lo", %q }`, Bridge)
	// Set dropped records the addresses of what was dropped, for the report.
	return fmt.Sprintf(`table inet %[1]s {
	set dropped {
		type ipv4_addr . ipv4_addr
		flags dynamic
		size 256
	}
	chain postrouting {
		type filter hook postrouting priority srcnat - 10; policy accept;
		oifname != %[2]s ip daddr { %[3]s } add @dropped { ip saddr . ip daddr } counter drop
		oifname != %[2]s ip saddr { %[3]s } add @dropped { ip saddr . ip daddr } counter drop
	}
	chain forward {
		type filter hook forward priority filter - 10; policy accept;
		iifname %[4]q oifname != %[4]q add @dropped { ip saddr . ip daddr } counter drop
		ip saddr { %[3]s } oifname != %[4]q add @dropped { ip saddr . ip daddr } counter drop
		meta nfproto ipv6 iifname %[4]q oifname != %[4]q counter drop
	}
}
`, guardTable, local, ranges, Bridge)
}

// installGuard adds the guard (replacing an earlier one of a run that died).
func installGuard() error {
	_ = exec.Command("nft", "delete", "table", "inet", guardTable).Run()
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(guardRules())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("installing the network guard (nft table inet %s): %w: %s", guardTable, err, out)
	}
	return nil
}

// lastGuardListing is the guard's table as GuardDrops last read it: its
// set "dropped" names the source and destination of what it dropped.
var lastGuardListing string

// GuardListing is the guard's table as GuardDrops last read it.
func GuardListing() string { return lastGuardListing }

var counterRE = regexp.MustCompile(`counter packets (\d+) bytes \d+`)

// GuardDrops reads the guard's counters: the packets it dropped, each a
// packet that would have left the machine. It fails if the guard is gone
// or has fewer counters than it was made with.
func GuardDrops() (int, error) {
	out, err := exec.Command("nft", "list", "table", "inet", guardTable).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("the network guard (nft table inet %s) is missing: %w: %s", guardTable, err, out)
	}
	counters := counterRE.FindAllStringSubmatch(string(out), -1)
	if want := strings.Count(guardRules(), "counter drop"); len(counters) != want {
		return 0, fmt.Errorf("the network guard has %d counters, want %d:\n%s", len(counters), want, out)
	}
	lastGuardListing = string(out)
	total := 0
	for _, c := range counters {
		n, _ := strconv.Atoi(c[1])
		total += n
	}
	return total, nil
}

func removeGuard() error {
	if out, err := exec.Command("nft", "delete", "table", "inet", guardTable).CombinedOutput(); err != nil {
		return fmt.Errorf("removing the network guard: %w: %s", err, out)
	}
	return nil
}
