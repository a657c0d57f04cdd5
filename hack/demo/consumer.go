package main

import (
	"context"
	"fmt"
	"os"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/konnector"
)

const (
	// konnectorTokenTTL bounds the konnector's ServiceAccount token; a demo
	// runs for hours at most (a restarted konnector gets a new one).
	konnectorTokenTTL = 24 * time.Hour
	// konnectorRestartDelay is the pause before the konnector runs again
	// after it exited, as a kubelet would restart its pod.
	konnectorRestartDelay = 2 * time.Second
)

// findKonnector looks for the released konnector and kubectl-bind where the
// tests find them; without the konnector the demo still binds, but nothing
// syncs.
func (d *demo) findKonnector() {
	t := time.Now()
	bin, err := konnector.ReleasedPathOf(konnector.ReleasedV1alpha2, "konnector")
	if err != nil {
		d.konnectorErr = err
		d.step("no released konnector %s (%v): the bind command will run with --skip-konnector", konnector.ReleasedV1alpha2, err)
		return
	}
	d.konnectorBinary = bin
	d.step("found the released konnector %s: %s (%s)", konnector.ReleasedV1alpha2, bin, since(t))
	if cli, err := konnector.ReleasedPathOf(konnector.ReleasedV1alpha2, "kubectl-bind"); err == nil {
		d.releasedCLI = cli
	}
}

// installBindingsAPI serves APIServiceBindings in the consumer cluster when
// no konnector will run there to install their CRD (it does so when it
// starts): the bind command waits until it can list them. Our own minimal
// definition: any fields, a status subresource.
func (d *demo) installBindingsAPI(ctx context.Context) error {
	client, err := apiextensionsclient.NewForConfig(d.consumerCP.AdminConfig())
	if err != nil {
		return err
	}
	preserve := true
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "apiservicebindings.kube-bind.io"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "kube-bind.io",
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Plural: "apiservicebindings", Singular: "apiservicebinding", Kind: "APIServiceBinding", ListKind: "APIServiceBindingList",
			},
			Scope: apiextensionsv1.ClusterScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1alpha2", Served: true, Storage: true,
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: &preserve,
				}},
			}},
		},
	}
	crds := client.ApiextensionsV1().CustomResourceDefinitions()
	if _, err := crds.Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return exampleapis.WaitEstablished(ctx, crds, crd.Name)
}

// startKonnectorWatcher starts the goroutine that stands in for the
// kubelet of the consumer cluster, which has no nodes: once the bind
// command has deployed the konnector there, it runs the released konnector
// as a process with a token of the ServiceAccount the command created (so
// it has exactly the command's RBAC), in a network namespace of its own
// (it serves :8080 on all interfaces, like the backend's default port).
// stop ends it and waits for it.
func (d *demo) startKonnectorWatcher() error {
	kube, err := kubernetes.NewForConfig(d.consumerCP.AdminConfig())
	if err != nil {
		return err
	}
	if d.konnectorLog, err = os.OpenFile(d.path("konnector.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.watchCancel = cancel
	d.watchDone = make(chan struct{})
	go func() {
		defer close(d.watchDone)
		d.runKonnector(ctx, kube)
	}()
	return nil
}

// runKonnector waits for the konnector Deployment, runs the konnector until
// ctx ends, and runs it again should it exit.
func (d *demo) runKonnector(ctx context.Context, kube kubernetes.Interface) {
	for {
		token, err := konnector.TokenWhenDeployed(ctx, kube, konnectorTokenTTL, nil)
		if err != nil {
			if ctx.Err() == nil {
				d.step("cannot run the konnector: %v", err)
			}
			return
		}
		kubeconfig := d.path("konnector.kubeconfig")
		if err := controlplane.WriteKubeconfig(kubeconfig, d.consumerCP.ConfigForToken(token)); err != nil {
			d.step("cannot run the konnector: %v", err)
			return
		}
		k, err := konnector.Run(konnector.Options{
			Kubeconfig: kubeconfig,
			Servers:    []string{d.cp.Host()}, // the issued kubeconfig names the provider's API server
			Binary:     d.konnectorBinary,
			Netbridge:  d.opts.netbridgeBinary,
			Output:     d.konnectorLog,
		})
		if err != nil {
			d.step("cannot run the konnector: %v", err)
			return
		}
		d.step("the bind command deployed the konnector into the consumer cluster; running it here as ServiceAccount %s/%s (pid %d, log: %s)",
			"kube-bind", "konnector", k.Pid(), d.path("konnector.log"))
		select {
		case <-ctx.Done():
			k.Stop()
			return
		case <-k.Done():
			_, err := k.Exited()
			k.Stop() // closes its bridges
			d.step("the konnector exited (%v); running it again in %s (log: %s)", err, konnectorRestartDelay, d.path("konnector.log"))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(konnectorRestartDelay):
		}
	}
}

// stopKonnectorWatcher ends the watcher and the konnector it runs, and
// waits for both.
func (d *demo) stopKonnectorWatcher() {
	if d.watchCancel != nil {
		d.watchCancel()
		<-d.watchDone
	}
	if d.konnectorLog != nil {
		d.konnectorLog.Close()
	}
}

// writeExampleObject writes a MangoDB for the consumer to create once the
// API is bound; the konnector syncs it to the provider.
func writeExampleObject(path string) error {
	a := exampleapis.MangoDB
	obj := fmt.Sprintf(`apiVersion: %s/v1alpha1
kind: %s
metadata:
  name: my-db
  namespace: default
spec:
  tier: gold
`, a.Group, a.Kind)
	return os.WriteFile(path, []byte(obj), 0o644)
}
