package controlplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	clientcmdlatest "k8s.io/client-go/tools/clientcmd/api/latest"
)

// ServiceAccountTokenTTL is how long tokens from ServiceAccountToken stay valid.
const ServiceAccountTokenTTL = 24 * time.Hour

// WriteKubeconfig writes a kubeconfig file for a bearer token at server (https://HOST:PORT).
// It skips TLS verification: the control plane's serving certificate is self-signed.
func WriteKubeconfig(path, server, user, token string) error {
	const name = "shardproxy"
	config := clientcmdapi.Config{
		Clusters: map[string]*clientcmdapi.Cluster{
			name: {Server: server, InsecureSkipTLSVerify: true},
		},
		AuthInfos: map[string]*clientcmdapi.AuthInfo{
			user: {Token: token},
		},
		Contexts: map[string]*clientcmdapi.Context{
			name: {Cluster: name, AuthInfo: user, Namespace: metav1.NamespaceDefault},
		},
		CurrentContext: name,
	}
	// This is what clientcmd.WriteToFile does, without importing clientcmd, which drags in
	// a flag library the main module does not otherwise need.
	data, err := runtime.Encode(clientcmdlatest.Codec, &config)
	if err != nil {
		return fmt.Errorf("encoding kubeconfig %s: %w", path, err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("writing kubeconfig: %w", err)
	}
	return nil
}

// ServiceAccountToken creates the namespace and the ServiceAccount if they do not exist and
// returns a token for the ServiceAccount from the TokenRequest API, valid for
// ServiceAccountTokenTTL. It grants nothing: bind roles to
// system:serviceaccount:NAMESPACE:NAME.
func (cp *ControlPlane) ServiceAccountToken(ctx context.Context, namespace, name string) (string, error) {
	client := cp.Client()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	if _, err := client.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating service account %s/%s: %w", namespace, name, err)
	}
	ttl := int64(ServiceAccountTokenTTL / time.Second)
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}}
	resp, err := client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a token for service account %s/%s: %w", namespace, name, err)
	}
	return resp.Status.Token, nil
}

// ServiceAccountKubeconfig is ServiceAccountToken written as a kubeconfig for Host, in the
// control plane's directory; it returns the file's path. Use it to run a component with
// exactly the permissions its ClusterRole grants.
func (cp *ControlPlane) ServiceAccountKubeconfig(ctx context.Context, namespace, name string) (string, error) {
	token, err := cp.ServiceAccountToken(ctx, namespace, name)
	if err != nil {
		return "", err
	}
	path := filepath.Join(cp.Dir, fmt.Sprintf("serviceaccount-%s-%s.kubeconfig", namespace, name))
	user := fmt.Sprintf("system:serviceaccount:%s:%s", namespace, name)
	if err := WriteKubeconfig(path, cp.Host, user, token); err != nil {
		return "", err
	}
	return path, nil
}
