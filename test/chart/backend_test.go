package chart_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil/certs"
)

// testBackendRunsWithChartConfig starts the real backend binary with the
// flags the chart renders (one replica) and the key files of the Secret the
// release made, talking to the API server with a token of the chart's
// ServiceAccount and to a real OpenID Connect provider, and checks that the
// chart's readiness probe passes (so the chart's RBAC covers what the
// backend needs to become ready) and that it shuts down cleanly.
//
// With ring, the replica finds its peers through the chart's headless
// Service with the chart's Role; as no kubelet or EndpointSlice controller
// runs here, the test publishes the EndpointSlice a controller would, from
// the rendered Service's port.
//
// With TLS, the backend serves the chart's mounted TLS Secret (laid out as
// the kubelet does) on the probes' scheme, and a renewal of the Secret is
// served to new connections while an open one carries on.
func testBackendRunsWithChartConfig(t *testing.T, cp *controlplane.ControlPlane, admin kubernetes.Interface, mode backendMode) {
	ring := mode == ringMode
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	secret, err := admin.CoreV1().Secrets(releaseNS).Get(ctx, fullname, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secretsDir := t.TempDir()
	for k, v := range secret.Data {
		if err := os.WriteFile(filepath.Join(secretsDir, k), v, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tr, err := admin.CoreV1().ServiceAccounts(releaseNS).CreateToken(ctx, fullname, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := controlplane.KubeconfigFile(t, cp.ConfigForToken(tr.Status.Token))

	port := freePort(t)
	scheme := "http"
	var tlsA, tlsB certs.Pair
	var tlsVolume *certs.SecretVolume
	client := &http.Client{Timeout: 5 * time.Second}
	if mode == tlsMode {
		scheme = "https"
		tlsA, tlsB = certs.NewServingPair(t, "a"), certs.NewServingPair(t, "b")
		tlsVolume = certs.NewSecretVolume(t, tlsA)
		pool := x509.NewCertPool()
		pool.AddCert(tlsA.Cert)
		pool.AddCert(tlsB.Cert)
		client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	}
	base := fmt.Sprintf("%s://127.0.0.1:%d", scheme, port)
	idp := oidcprovider.Start(t, oidcprovider.Options{RedirectURIs: []string{base + "/callback"}})
	if err := os.WriteFile(filepath.Join(secretsDir, "oidc-client-secret"), []byte(idp.ClientSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	sets := []string{"replicaCount=1", fmt.Sprintf("containerPort=%d", port),
		"externalURL=" + base, "oidc.issuerURL=" + idp.IssuerURL, "oidc.clientID=" + idp.ClientID}
	peerPort := freePort(t)
	podIP := "127.0.0.1"
	if ring {
		// EndpointSlices refuse loopback addresses: the peer API listens on
		// an address of this machine that they accept, as on a pod IP.
		podIP = hostIP(t)
		sets = append(sets, "replicaCount=2", fmt.Sprintf("ring.port=%d", peerPort))
	}
	if mode == tlsMode {
		sets = append(sets, "tls.enabled=true", "tls.existingSecret=kbb-tls")
	}
	objs := renderIn(t, releaseNS, sets...)
	// The probes go to the diagnostics listener, plain HTTP whatever the
	// public port serves.
	probe := asMap(t, asMap(t, container(t, objs)["readinessProbe"])["httpGet"])
	if probe["scheme"] != "HTTP" || probe["port"] != "diagnostics" {
		t.Fatalf("the chart's readiness probe %v, want HTTP on port diagnostics", probe)
	}
	diagPort := freePort(t)
	diag := fmt.Sprintf("http://127.0.0.1:%d", diagPort)
	diagClient := &http.Client{Timeout: 5 * time.Second}
	if ring {
		publishPeerEndpoints(t, ctx, admin, objs, podIP, peerPort)
	}
	var args []string
	for _, a := range asSlice(t, container(t, objs)["args"]) {
		s := strings.Replace(a.(string), secretDir, secretsDir, 1)
		if tlsVolume != nil {
			s = strings.Replace(s, "/etc/kube-bind-backend/tls", tlsVolume.Dir(), 1)
		}
		// Not on every interface of the test machine.
		if strings.HasPrefix(s, "--listen-address=") {
			s = fmt.Sprintf("--listen-address=127.0.0.1:%d", port)
		}
		if strings.HasPrefix(s, "--diagnostics-address=") {
			s = fmt.Sprintf("--diagnostics-address=127.0.0.1:%d", diagPort)
		}
		if strings.HasPrefix(s, "--peer-listen-address=") {
			s = fmt.Sprintf("--peer-listen-address=%s", net.JoinHostPort(podIP, fmt.Sprint(peerPort)))
		}
		args = append(args, s)
	}
	// In a pod the backend uses the in-cluster configuration of the
	// ServiceAccount; here the same identity comes from a kubeconfig.
	args = append(args, "--kubeconfig="+kubeconfig)

	var logs procs.Buffer
	cmd := exec.Command(backendBinary(t), args...)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	// The pod's downward-API environment, as the chart sets it.
	cmd.Env = append(os.Environ(), "POD_NAME=kbb-0", "POD_NAMESPACE="+releaseNS, "POD_IP="+podIP)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
	}()

	deadline := time.Now().Add(20 * time.Second)
	for {
		code, _, err := get(client, base+"/healthz")
		if err == nil && code == http.StatusOK {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("the backend exited with the chart's configuration: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz never answered 200 (last: %d %v)\n%s", code, err, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Ready, and the identity provider is found and the provider cluster
	// is reachable with the chart's RBAC (the status page).
	var code int
	var body string
	for deadline := time.Now().Add(20 * time.Second); ; {
		code, body, err = get(diagClient, diag+probe["path"].(string))
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never answered 200 with the chart's configuration: %d %v\n%s\nlogs:\n%s", code, err, body, logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("/readyz with the chart's configuration: %d %s", code, strings.TrimSpace(body))
	for deadline := time.Now().Add(30 * time.Second); ; {
		code, body, err = get(diagClient, diag+"/statusz")
		if err == nil && code == http.StatusOK && strings.Contains(body, "[+]oidc ok") && strings.Contains(body, "[+]provider-cluster ok") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/statusz never showed both dependencies answering: %d %v\n%s\nlogs:\n%s", code, err, body, logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The public port has neither the metrics nor the detail.
	if code, body, err := get(client, base+"/metrics"); err != nil || code != http.StatusNotFound {
		t.Errorf("public /metrics with the chart's configuration: %d %v %.200s", code, err, body)
	}
	if mode == memoryMode {
		// The controllers run: leader election with the chart's Lease Role
		// (POD_NAMESPACE as the chart sets it), and their caches fill with
		// the chart's ClusterRoles.
		for deadline := time.Now().Add(30 * time.Second); ; {
			l := logs.String()
			// The manager starts a controller's workers once its sources
			// synced; the credentials and cleanup controllers log no line
			// of their own then.
			if strings.Contains(l, "leader election: became leader") && strings.Contains(l, "exports controllers: caches synced") &&
				strings.Contains(l, "binding health: caches synced") && workersStarted(l, "credentials") && workersStarted(l, "cleanup") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the controllers did not become leader and sync within 30s with the chart's RBAC:\n%s", l)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// A session can be created: the store (and for ring, the ring of
	// this one replica found through the chart's Service) works.
	resp, err := client.Post(base+"/sessions", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	created, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || !strings.Contains(string(created), `"sessionID"`) {
		t.Errorf("POST /sessions: %d %s\nlogs:\n%s", resp.StatusCode, created, logs.String())
	}
	if mode == tlsMode {
		checkCertificateRotation(t, client, base, tlsVolume, tlsA, tlsB)
	}
	if strings.Contains(logs.String(), idp.ClientSecret) {
		t.Error("the backend logged the OIDC client secret")
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("the backend did not exit cleanly on SIGTERM: %v\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the backend did not stop within 30s of SIGTERM\n%s", logs.String())
	}
}

func get(c *http.Client, url string) (int, string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(b), nil
}

// hostIP returns a non-loopback IPv4 address of this machine.
func hostIP(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	t.Fatalf("this machine has no non-loopback IPv4 address for the ring replica to listen on (have %v)", addrs)
	return ""
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// publishPeerEndpoints makes the EndpointSlice the EndpointSlice controller
// would make for the chart's peer Service with one ready replica on
// ip:peerPort, using the Service's rendered name and port name.
func publishPeerEndpoints(t *testing.T, ctx context.Context, admin kubernetes.Interface, objs objects, ip string, peerPort int) {
	t.Helper()
	svc := objs.get(t, "Service", fullname+"-peers")
	portName := asMap(t, asSlice(t, field(t, svc, "spec", "ports"))[0])["name"].(string)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:   svc.GetName() + "-test",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc.GetName()},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: &portName, Port: ptr(int32(peerPort)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	if _, err := admin.DiscoveryV1().EndpointSlices(releaseNS).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.DiscoveryV1().EndpointSlices(releaseNS).Delete(context.Background(), slice.Name, metav1.DeleteOptions{})
	})
}

type backendMode int

const (
	memoryMode backendMode = iota
	ringMode
	tlsMode
)

// checkCertificateRotation renews the mounted TLS Secret (b replaces a)
// and checks that new connections get b without a restart while the open
// keep-alive connection of client carries on.
func checkCertificateRotation(t *testing.T, client *http.Client, base string, vol *certs.SecretVolume, a, b certs.Pair) {
	t.Helper()
	serialOf := func(c *http.Client) (string, bool) {
		var reused bool
		req, _ := http.NewRequest(http.MethodGet, base+"/healthz", nil)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
		}))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET /healthz over TLS: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /healthz over TLS: %d", resp.StatusCode)
		}
		return resp.TLS.PeerCertificates[0].SerialNumber.String(), reused
	}
	if s, _ := serialOf(client); s != a.Cert.SerialNumber.String() {
		t.Fatalf("before renewal the backend serves serial %s, want %s", s, a.Cert.SerialNumber)
	}
	vol.Publish(b)
	fresh := func() *http.Client {
		tr := client.Transport.(*http.Transport).Clone()
		return &http.Client{Transport: tr, Timeout: 5 * time.Second}
	}
	deadline := time.Now().Add(20 * time.Second) // the file watch, else the periodic check
	for {
		c := fresh()
		s, _ := serialOf(c)
		c.CloseIdleConnections()
		if s == b.Cert.SerialNumber.String() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the backend never served the renewed certificate to a new connection")
		}
		time.Sleep(100 * time.Millisecond)
	}
	s, reused := serialOf(client)
	if !reused || s != a.Cert.SerialNumber.String() {
		t.Errorf("the connection opened before the renewal: reused=%v serial %s, want reused with %s", reused, s, a.Cert.SerialNumber)
	}
}

// workersStarted says whether the backend's JSON log l shows that the
// manager started the workers of controller name (its caches synced).
func workersStarted(l, name string) bool {
	for line := range strings.Lines(l) {
		if strings.Contains(line, `"msg":"Starting workers"`) && strings.Contains(line, `"controller":"`+name+`"`) {
			return true
		}
	}
	return false
}
