package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/shardproxy/shardproxy/supervisor/config/fromkubeproxy"
)

// configCommand is `shardproxy config from-kube-proxy`.
func configCommand() *cli.Command {
	return &cli.Command{
		Name:  "config",
		Usage: "configuration tools",
		Subcommands: []*cli.Command{{
			Name:  "from-kube-proxy",
			Usage: "print the shardproxy configuration that behaves as a kube-proxy configuration does",
			Description: `Reads a KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1) from --file (the object,
or a ConfigMap holding it), or from the kube-proxy ConfigMap of kube-system through a
kubeconfig (--from-cluster), and prints the shardproxy configuration with the same
behaviour: node port addresses, local traffic detection, masquerade bit and
masqueradeAll, sync periods, conntrack settings, bind addresses. Its header lists, with
why, every setting it cannot carry. --alongside writes it to run beside that kube-proxy
(staged migration): its own ports and masquerade bit, conntrack left to kube-proxy,
one instance serving the Services labeled service.kubernetes.io/service-proxy-name:
shardproxy in the --namespace list.`,
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "file", Aliases: []string{"f"}, Usage: "a KubeProxyConfiguration file, or a ConfigMap YAML holding one"},
				&cli.BoolFlag{Name: "from-cluster", Usage: "read the ConfigMap from the cluster (--configmap) through --kubeconfig"},
				&cli.StringFlag{Name: "kubeconfig", Usage: "with --from-cluster: kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else in-cluster)"},
				&cli.StringFlag{Name: "configmap", Value: "kube-system/kube-proxy", Usage: "with --from-cluster: the ConfigMap, namespace/name"},
				&cli.BoolFlag{Name: "alongside", Usage: "to run beside this kube-proxy rather than instead of it"},
				&cli.StringSliceFlag{Name: "namespace", Aliases: []string{"n"}, Usage: "with --alongside: a namespace whose labeled Services the instance serves (repeat; default: default)"},
			},
			Action: func(c *cli.Context) error {
				if c.IsSet("file") == c.Bool("from-cluster") {
					return newUsageError(c, errors.New("give exactly one of --file and --from-cluster"))
				}
				if c.IsSet("namespace") && !c.Bool("alongside") {
					return newUsageError(c, errors.New("--namespace only applies to --alongside"))
				}
				kp, source, err := readKubeProxyConfig(c.Context, c.String("file"), c.String("kubeconfig"), c.String("configmap"))
				if err != nil {
					return err
				}
				return printConverted(c.App.Writer, kp, fromkubeproxy.Options{
					Alongside: c.Bool("alongside"), Namespaces: c.StringSlice("namespace"), Source: source,
				})
			},
		}},
	}
}

// readKubeProxyConfig reads the configuration from file, or else from the ConfigMap
// (namespace/name) through the kubeconfig; source names where it came from.
func readKubeProxyConfig(ctx context.Context, file, kubeconfig, configMap string) (*kpv1alpha1.KubeProxyConfiguration, string, error) {
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, "", fmt.Errorf("reading the kube-proxy configuration: %w", err)
		}
		kp, err := fromkubeproxy.Decode(data)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", file, err)
		}
		return kp, file, nil
	}
	ns, name, ok := strings.Cut(configMap, "/")
	if !ok || ns == "" || name == "" {
		return nil, "", fmt.Errorf("--configmap %q: want namespace/name", configMap)
	}
	rc, err := operatorRESTConfig(kubeconfig)
	if err != nil {
		return nil, "", err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, "", fmt.Errorf("creating API client: %w", err)
	}
	cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, "", fmt.Errorf("reading ConfigMap %s: %w", configMap, err)
	}
	kp, err := fromkubeproxy.FromConfigMap(cm)
	if err != nil {
		return nil, "", err
	}
	return kp, "ConfigMap " + configMap, nil
}

func printConverted(w io.Writer, kp *kpv1alpha1.KubeProxyConfiguration, opts fromkubeproxy.Options) error {
	out, err := fromkubeproxy.Convert(kp, opts)
	if err != nil {
		return err
	}
	_, err = w.Write(out)
	return err
}
