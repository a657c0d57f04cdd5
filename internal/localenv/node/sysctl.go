package node

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// changedSysctls are what the kubelet, kube-proxy and the CNI bridge
// change on the host: recorded before the node starts and written back
// when it stops. (ip_forward resets every conf.*.forwarding when written,
// so it comes first and the per-interface defaults after it.)
var changedSysctls = []string{
	"net/ipv4/ip_forward",
	"net/ipv4/conf/all/forwarding",
	"net/ipv4/conf/default/forwarding",
	"net/ipv4/conf/all/route_localnet",
	"net/bridge/bridge-nf-call-iptables",
	"net/bridge/bridge-nf-call-ip6tables",
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
	"net/netfilter/nf_conntrack_max",
	"net/netfilter/nf_conntrack_tcp_timeout_established",
	"net/netfilter/nf_conntrack_tcp_timeout_close_wait",
}

type sysctlValue struct{ key, value string }

func recordSysctls() []sysctlValue {
	var saved []sysctlValue
	for _, k := range changedSysctls {
		b, err := os.ReadFile(filepath.Join("/proc/sys", k))
		if err != nil {
			continue // not on this kernel
		}
		saved = append(saved, sysctlValue{k, strings.TrimSpace(string(b))})
	}
	return saved
}

// restoreSysctls writes back every recorded value that changed.
func restoreSysctls(saved []sysctlValue) error {
	var errs []string
	for _, s := range saved {
		p := filepath.Join("/proc/sys", s.key)
		b, err := os.ReadFile(p)
		if err == nil && strings.TrimSpace(string(b)) == s.value {
			continue
		}
		if err := os.WriteFile(p, []byte(s.value), 0o644); err != nil {
			errs = append(errs, fmt.Sprintf("%s=%s: %v", s.key, s.value, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("restoring sysctls: %s", strings.Join(errs, "; "))
	}
	return nil
}

// sysctlsDiffer lists the recorded sysctls whose value differs now.
func sysctlsDiffer(saved []sysctlValue) []string {
	var diff []string
	for _, s := range saved {
		b, err := os.ReadFile(filepath.Join("/proc/sys", s.key))
		if v := strings.TrimSpace(string(b)); err != nil || v != s.value {
			diff = append(diff, fmt.Sprintf("%s=%s (was %s)", s.key, v, s.value))
		}
	}
	return diff
}
