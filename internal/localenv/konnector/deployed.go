package konnector

import (
	"context"
	"errors"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/client/apply"
)

// ErrGaveUp is TokenWhenDeployed's error when its giveUp channel closed
// first.
var ErrGaveUp = errors.New("gave up waiting for the konnector Deployment")

// deployedPoll is how often TokenWhenDeployed looks for the Deployment.
const deployedPoll = 250 * time.Millisecond

// TokenWhenDeployed waits until kube-bind-poll has deployed the konnector
// into the consumer cluster of kube (the Deployment, which the command
// creates after the konnector's RBAC and ServiceAccount), then returns a
// token of that ServiceAccount from a TokenRequest, valid for ttl.
//
// Pods never run in the node-less control planes of the tests and the
// demo, so the Deployment's konnector never starts there; running the
// released konnector as a process with this token stands in for it, and
// the RBAC the command wrote is all it gets. TokenWhenDeployed gives up when
// ctx ends or giveUp closes (the command exited; nil: never).
func TokenWhenDeployed(ctx context.Context, kube kubernetes.Interface, ttl time.Duration, giveUp <-chan struct{}) (string, error) {
	for {
		_, err := kube.AppsV1().Deployments(apply.Namespace).Get(ctx, apply.KonnectorName, metav1.GetOptions{})
		if err == nil {
			break
		}
		// Not found yet, or a transient error (a timeout, the API server
		// busy): look again; ctx bounds the wait, and the last answer is
		// in the error.
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no konnector Deployment %s/%s: %w (last answer: %v)", apply.Namespace, apply.KonnectorName, ctx.Err(), err)
		case <-giveUp:
			return "", fmt.Errorf("%w %s/%s (last answer: %v)", ErrGaveUp, apply.Namespace, apply.KonnectorName, err)
		case <-time.After(deployedPoll):
		}
	}
	seconds := int64(ttl / time.Second)
	tr, err := kube.CoreV1().ServiceAccounts(apply.Namespace).CreateToken(ctx, apply.KonnectorName,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("a token of ServiceAccount %s/%s: %w", apply.Namespace, apply.KonnectorName, err)
	}
	return tr.Status.Token, nil
}
