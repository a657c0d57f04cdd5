package controlplane_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/procs"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashHelperEnv) != "" {
		crashHelper()
		return
	}
	os.Exit(controlplane.RunMain(m))
}

func clientset(t *testing.T, cfg *rest.Config) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func createNamespace(t *testing.T, admin kubernetes.Interface) string {
	t.Helper()
	ns, err := admin.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cp-test-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	return ns.Name
}

func whoAmI(t *testing.T, cfg *rest.Config) authenticationv1.UserInfo {
	t.Helper()
	review, err := clientset(t, cfg).AuthenticationV1().SelfSubjectReviews().Create(context.Background(),
		&authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview: %v", err)
	}
	return review.Status.UserInfo
}

// A token from TokenRequest authenticates as the ServiceAccount, and RBAC
// lets it do exactly what a Role grants.
func TestServiceAccountTokenAndRBAC(t *testing.T) {
	cp := controlplane.Get(t)
	ctx := context.Background()
	admin := clientset(t, cp.AdminConfig())
	ns := createNamespace(t, admin)

	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "robot"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "read-configmaps"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "robot-reads-configmaps"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "read-configmaps"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "robot", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	tr, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "robot", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest: %v", err)
	}
	if tr.Status.Token == "" {
		t.Fatal("TokenRequest returned an empty token")
	}
	robotCfg := cp.ConfigForToken(tr.Status.Token)
	if got, want := whoAmI(t, robotCfg).Username, "system:serviceaccount:"+ns+":robot"; got != want {
		t.Errorf("token authenticates as %q, want %q", got, want)
	}

	robot := clientset(t, robotCfg)
	// The root-CA publisher put kube-root-ca.crt into the new namespace, with
	// the CA that signed the API server's certificate.
	var rootCA *corev1.ConfigMap
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		rootCA, err = robot.CoreV1().ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("allowed: get configmap kube-root-ca.crt in %s: %v", ns, err)
	}
	if rootCA.Data["ca.crt"] != string(cp.CAData()) {
		t.Errorf("kube-root-ca.crt holds %q, want the control plane's CA", rootCA.Data["ca.crt"])
	}
	if _, err := robot.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("allowed: list configmaps in %s: %v", ns, err)
	}
	if _, err := robot.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("list secrets in %s: got %v, want forbidden", ns, err)
	}
	if _, err := robot.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("list configmaps in default: got %v, want forbidden", err)
	}
	if _, err := robot.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("create configmap in %s: got %v, want forbidden", ns, err)
	}
}

// A legacy token Secret is filled by kube-controller-manager's token
// controller, and its token works.
func TestLegacyServiceAccountTokenSecret(t *testing.T) {
	cp := controlplane.Get(t)
	ctx := context.Background()
	admin := clientset(t, cp.AdminConfig())
	ns := createNamespace(t, admin)
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "legacy"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "legacy-token", Annotations: map[string]string{corev1.ServiceAccountNameKey: "legacy"}},
		Type:       corev1.SecretTypeServiceAccountToken,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var secret *corev1.Secret
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		secret, err = admin.CoreV1().Secrets(ns).Get(ctx, "legacy-token", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return len(secret.Data[corev1.ServiceAccountTokenKey]) > 0, nil
	})
	if err != nil {
		t.Fatalf("the token controller did not fill the Secret: %v (data keys: %v)", err, keys(secret))
	}
	if got := secret.Data[corev1.ServiceAccountRootCAKey]; string(got) != string(cp.CAData()) {
		t.Errorf("Secret ca.crt = %q, want the control plane's CA", got)
	}
	if got := string(secret.Data[corev1.ServiceAccountNamespaceKey]); got != ns {
		t.Errorf("Secret namespace = %q, want %q", got, ns)
	}
	user := whoAmI(t, cp.ConfigForToken(string(secret.Data[corev1.ServiceAccountTokenKey])))
	if want := "system:serviceaccount:" + ns + ":legacy"; user.Username != want {
		t.Errorf("legacy token authenticates as %q, want %q", user.Username, want)
	}
}

func keys(s *corev1.Secret) []string {
	if s == nil {
		return nil
	}
	var ks []string
	for k := range s.Data {
		ks = append(ks, k)
	}
	return ks
}

// ConfigForUser is a real identity: the API server reports its name and
// groups, and RBAC gives it nothing until granted.
func TestConfigForUser(t *testing.T) {
	cp := controlplane.Get(t)
	ctx := context.Background()
	cfg := controlplane.ConfigForUser(t, cp, "alice", "team-a", "team-b")
	user := whoAmI(t, cfg)
	if user.Username != "alice" {
		t.Errorf("user name = %q, want alice", user.Username)
	}
	for _, g := range []string{"team-a", "team-b", "system:authenticated"} {
		if !slices.Contains(user.Groups, g) {
			t.Errorf("groups %v lack %q", user.Groups, g)
		}
	}
	if _, err := clientset(t, cfg).CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("alice lists namespaces: got %v, want forbidden", err)
	}

	admin := clientset(t, cp.AdminConfig())
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "team-a-views"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "team-a"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), "team-a-views", metav1.DeleteOptions{})
	})
	// RBAC's authorizer reads from an informer: the binding shows up shortly.
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := clientset(t, cfg).CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Errorf("alice in team-a, bound to cluster-admin, cannot list namespaces: %v", err)
	}
	if who := whoAmI(t, controlplane.ConfigForUser(t, cp, "bob")); who.Username != "bob" || slices.Contains(who.Groups, "team-a") {
		t.Errorf("bob = %+v, want user bob without team-a", who)
	}
}

// The admin kubeconfig file works for a separate process (kubectl), and
// WriteKubeconfig writes one for another identity.
func TestKubeconfigFilesWithKubectl(t *testing.T) {
	cp := controlplane.Get(t)
	out, err := exec.Command(filepath.Join(cp.BinDir(), "kubectl"), "--kubeconfig", cp.AdminKubeconfigPath(),
		"get", "namespace", "kube-system", "-o", "name").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "namespace/kube-system" {
		t.Errorf("kubectl get namespace kube-system as admin: %v: %s", err, out)
	}
	out, err = exec.Command(filepath.Join(cp.BinDir(), "kubectl"), "--kubeconfig", controlplane.KubeconfigFile(t, controlplane.ConfigForUser(t, cp, "carol")),
		"auth", "can-i", "list", "secrets", "-n", "kube-system").CombinedOutput()
	if err == nil || strings.TrimSpace(string(out)) != "no" {
		t.Errorf("kubectl auth can-i list secrets as carol: %v: %q, want no", err, out)
	}
	// The same file loads into a rest.Config that reaches the server.
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.AdminKubeconfigPath())
	if err != nil {
		t.Fatal(err)
	}
	if u := whoAmI(t, cfg); u.Username != controlplane.AdminUser || !slices.Contains(u.Groups, "system:masters") {
		t.Errorf("admin kubeconfig authenticates as %+v", u)
	}
}

// Without binaries the start fails with a message naming the script.
func TestMissingBinariesNameTheScript(t *testing.T) {
	t.Setenv(controlplane.BinariesEnv, t.TempDir())
	cp, err := controlplane.Start(context.Background(), controlplane.Options{})
	if err == nil {
		cp.Stop()
		t.Fatal("Start with an empty binaries folder succeeded")
	}
	if !strings.Contains(err.Error(), controlplane.InstallScript) || !strings.Contains(err.Error(), "kube-apiserver") {
		t.Errorf("Start with an empty binaries folder: %v, want an error naming %s and kube-apiserver", err, controlplane.InstallScript)
	}
}

const crashHelperEnv = "CONTROLPLANE_TEST_CRASH_HELPER"

// crashHelper starts a control plane, prints the servers' process ids and
// dies without any cleanup.
func crashHelper() {
	cp, err := controlplane.Start(context.Background(), controlplane.Options{})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	for _, pid := range controlplane.Pids(cp) {
		fmt.Println("pid", pid)
	}
	fmt.Println("logs", cp.LogDir())
	panic("test binary dies without stopping the control plane")
}

// If the test binary dies without cleanup, the kernel ends the servers.
func TestServersDieWithTestBinary(t *testing.T) {
	controlplane.Get(t) // fails here, with the reason, if the binaries are missing
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashHelperEnv+"=1")
	out, _ := cmd.CombinedOutput()
	var pids []int
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "pid" {
			pid, _ := strconv.Atoi(f[1])
			pids = append(pids, pid)
		} else if len(f) == 2 && f[0] == "logs" {
			t.Cleanup(func() { os.RemoveAll(f[1]) })
		}
	}
	if len(pids) != 3 {
		t.Fatalf("helper printed %d server pids, want 3; output:\n%s", len(pids), out)
	}
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		for _, pid := range pids {
			if procs.Alive(pid) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Errorf("servers %v still run after the test binary died", pids)
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// BenchmarkStartStop measures a whole start (until the API server is ready
// and the controller manager made the default ServiceAccount) and stop.
func BenchmarkStartStop(b *testing.B) {
	var ready, started, stopped time.Duration
	for b.Loop() {
		cp, err := controlplane.Start(context.Background(), controlplane.Options{})
		if err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		cp.Stop()
		stopped += time.Since(t0)
		ready += cp.APIServerReadyDuration()
		started += cp.StartupDuration()
		_ = os.RemoveAll(cp.LogDir())
	}
	n := float64(b.N)
	b.ReportMetric(ready.Seconds()/n, "s-apiserver-ready/op")
	b.ReportMetric(started.Seconds()/n, "s-started/op")
	b.ReportMetric(stopped.Seconds()/n, "s-stop/op")
}

func ptr[T any](v T) *T { return &v }

// In a package hack/test.sh runs among those without real parts, a
// control plane refuses to start, naming why.
func TestRefusedInTheParallelSet(t *testing.T) {
	t.Setenv(procs.ParallelSetEnv, "1")
	cp, err := controlplane.Start(context.Background(), controlplane.Options{})
	if err == nil {
		cp.Stop()
		t.Fatal("a control plane started in the parallel set")
	}
	if !strings.Contains(err.Error(), procs.ParallelSetEnv) {
		t.Errorf("the refusal %q does not name %s", err, procs.ParallelSetEnv)
	}
}
