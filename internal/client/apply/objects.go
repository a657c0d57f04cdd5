package apply

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// Names of what a bind creates in the consumer cluster. The namespace, the
// Secret key, the Deployment and the ServiceAccount are what the released
// konnector and CLI use; the RBAC names are ours.
const (
	Namespace           = "kube-bind"
	KubeconfigKey       = "kubeconfig"
	KubeconfigPrefix    = "kubeconfig-"
	KonnectorName       = "konnector"
	KonnectorRoleName   = "kube-bind-konnector"
	DefaultKonnector    = "ghcr.io/kube-bind/konnector:v0.4.8"
	BindingCRDName      = "apiservicebindings.kube-bind.io"
	konnectorHealthPort = 8080
	// v0.8's default --server-address.
	konnectorHealthPortV1alpha2 = 8090

	// LabelManagedBy marks what this client made.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "kube-bind-poll"
)

// Kube-bind resources in the consumer (bindings) and provider (requests)
// clusters.
var (
	BindingGVR = kbresources.APIServiceBindings
	RequestGVR = kbresources.APIServiceExportRequests
)

func managedLabels() map[string]string { return map[string]string{LabelManagedBy: managedBy} }

func namespaceObject() *corev1.Namespace {
	return &corev1.Namespace{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: Namespace},
	}
}

// kubeconfigSecret is the Secret holding the provider's kubeconfig; name ""
// makes a new one (generateName kubeconfig-). In v1alpha2 it carries the
// label the released v0.8 CLI sets.
func kubeconfigSecret(name string, kubeconfig []byte, gen generation) *corev1.Secret {
	labels := managedLabels()
	if gen.protocol == ProtocolV1alpha2 {
		labels[LabelProviderKubeconfig] = "true"
	}
	s := &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: labels},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{KubeconfigKey: kubeconfig},
	}
	if name == "" {
		s.GenerateName = KubeconfigPrefix
	}
	return s
}

// bindingOf is the APIServiceBinding of generation gen named after its
// request (<resource>.<group> in v1alpha1), pointing at the kubeconfig
// Secret secretName.
func bindingOf(gen generation, name, secretName string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gen.groupVersion,
		"kind":       "APIServiceBinding",
		"metadata":   map[string]any{"name": name, "labels": map[string]any{LabelManagedBy: managedBy}},
		"spec": map[string]any{
			"kubeconfigSecretRef": map[string]any{"namespace": Namespace, "name": secretName, "key": KubeconfigKey},
		},
	}}
	return u
}

func konnectorServiceAccount() *corev1.ServiceAccount {
	return &corev1.ServiceAccount{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
		ObjectMeta: metav1.ObjectMeta{Name: KonnectorName, Namespace: Namespace, Labels: managedLabels()},
	}
}

func konnectorClusterRoleBinding() *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: KonnectorRoleName, Labels: managedLabels()},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: KonnectorRoleName},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: KonnectorName, Namespace: Namespace}},
	}
}

func konnectorRoleBinding() *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: KonnectorRoleName, Namespace: Namespace, Labels: managedLabels()},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: KonnectorRoleName},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: KonnectorName, Namespace: Namespace}},
	}
}

// konnectorDeploymentOf is the konnector Deployment for a konnector of
// generation gen.
func konnectorDeploymentOf(gen generation, image string) *appsv1.Deployment {
	if gen.protocol == ProtocolV1alpha2 {
		return konnectorDeploymentV1alpha2(image)
	}
	return konnectorDeployment(image)
}

// konnectorDeploymentV1alpha2 runs konnector v0.8 as the released v0.8
// CLI does (Deployment kube-bind/konnector, label app=konnector, 2
// replicas, POD_NAME and POD_NAMESPACE), with healthz on :8090 named
// explicitly for the probes, its Lease in kube-bind, and locked down: the
// released image (alpine) would run as root, so a user is set.
func konnectorDeploymentV1alpha2(image string) *appsv1.Deployment {
	d := konnectorDeployment(image)
	uid := int64(65532)
	spec := &d.Spec.Template.Spec
	spec.SecurityContext.RunAsUser = &uid
	spec.SecurityContext.RunAsGroup = &uid
	c := &spec.Containers[0]
	c.Args = []string{"--lease-namespace=$(POD_NAMESPACE)", fmt.Sprintf("--server-address=:%d", konnectorHealthPortV1alpha2)}
	c.Ports = []corev1.ContainerPort{{Name: "healthz", ContainerPort: konnectorHealthPortV1alpha2}}
	probe := func() *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
			HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(konnectorHealthPortV1alpha2)},
		}}
	}
	c.ReadinessProbe = probe()
	c.LivenessProbe = probe()
	c.LivenessProbe.InitialDelaySeconds = 10
	c.LivenessProbe.FailureThreshold = 6
	return d
}

// konnectorDeployment runs the konnector as the released CLI does (2
// replicas, POD_NAME and POD_NAMESPACE, readiness on /healthz :8080), with
// its leader-election Lease in kube-bind (where its Role allows it) and a
// locked-down security context.
func konnectorDeployment(image string) *appsv1.Deployment {
	replicas := int32(2)
	labels := map[string]string{"app": KonnectorName}
	no, yes := false, true
	return &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: KonnectorName, Namespace: Namespace,
			Labels: map[string]string{"app": KonnectorName, LabelManagedBy: managedBy}},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: KonnectorName,
					SecurityContext:    &corev1.PodSecurityContext{RunAsNonRoot: &yes, SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
					Containers: []corev1.Container{{
						Name:  KonnectorName,
						Image: image,
						Args:  []string{"--lease-namespace=$(POD_NAMESPACE)"},
						Env: []corev1.EnvVar{
							{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
							{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
						},
						Ports: []corev1.ContainerPort{{Name: "healthz", ContainerPort: konnectorHealthPort}},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
							HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(konnectorHealthPort)},
						}},
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: &no,
							ReadOnlyRootFilesystem:   &yes,
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
					}},
				},
			},
		},
	}
}
