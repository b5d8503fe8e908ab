package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
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
masqueradeAll, sync periods, bind addresses. It writes what deploy/'s overlays can run,
and its header says what it changed for them (kube-proxy's kubeconfig file, which the
DaemonSet does not mount; the conntrack sysctls, which its unprivileged container cannot
write; replacing kube-proxy, the API server for apiserver-endpoint.yaml) and lists, with
why, every setting it cannot carry. --alongside writes it to run beside that kube-proxy
(staged migration; not beside IPVS mode): its own ports and masquerade bit, conntrack
left to kube-proxy, one instance serving the Services labeled
service.kubernetes.io/service-proxy-name: shardproxy in the --namespace list.
--write-overlay DIR writes config.yaml into a copy of an overlay, and the API server
into its apiserver-endpoint.yaml.`,
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "file", Aliases: []string{"f"}, Usage: "a KubeProxyConfiguration file, or a ConfigMap YAML holding one"},
				&cli.BoolFlag{Name: "from-cluster", Usage: "read the ConfigMap from the cluster (--configmap) through --kubeconfig"},
				&cli.StringFlag{Name: "kubeconfig", Usage: "with --from-cluster: kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else in-cluster)"},
				&cli.StringFlag{Name: "configmap", Value: "kube-system/kube-proxy", Usage: "with --from-cluster: the ConfigMap, namespace/name"},
				&cli.BoolFlag{Name: "alongside", Usage: "to run beside this kube-proxy rather than instead of it"},
				&cli.StringSliceFlag{Name: "namespace", Aliases: []string{"n"}, Usage: "with --alongside: a namespace whose labeled Services the instance serves (repeat; default: default)"},
				&cli.StringFlag{Name: "write-overlay", Usage: "write config.yaml into this copy of a deploy/ overlay instead of printing it, and, replacing kube-proxy, the API server of kube-proxy's kubeconfig into its apiserver-endpoint.yaml"},
			},
			Action: func(c *cli.Context) error {
				if c.IsSet("file") == c.Bool("from-cluster") {
					return newUsageError(c, errors.New("give exactly one of --file and --from-cluster"))
				}
				if c.IsSet("namespace") && !c.Bool("alongside") {
					return newUsageError(c, errors.New("--namespace only applies to --alongside"))
				}
				kp, source, server, err := readKubeProxyConfig(c.Context, c.String("file"), c.String("kubeconfig"), c.String("configmap"))
				if err != nil {
					return err
				}
				opts := fromkubeproxy.Options{
					Alongside: c.Bool("alongside"), Namespaces: c.StringSlice("namespace"), Source: source, APIServer: server,
				}
				out, err := fromkubeproxy.Convert(kp, opts)
				if err != nil {
					return err
				}
				if dir := c.String("write-overlay"); dir != "" {
					return writeOverlay(c.App.Writer, dir, out, opts)
				}
				_, err = c.App.Writer.Write(out)
				return err
			},
		}},
	}
}

// readKubeProxyConfig reads the configuration from file, or else from the ConfigMap
// (namespace/name) through the kubeconfig; source names where it came from, server is
// the API server of the kubeconfig a kubeadm ConfigMap holds ("" if none).
func readKubeProxyConfig(ctx context.Context, file, kubeconfig, configMap string) (kp *kpv1alpha1.KubeProxyConfiguration, source, server string, err error) {
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, "", "", fmt.Errorf("reading the kube-proxy configuration: %w", err)
		}
		if kp, err = fromkubeproxy.Decode(data); err != nil {
			return nil, "", "", fmt.Errorf("%s: %w", file, err)
		}
		if server, err = fromkubeproxy.APIServer(data); err != nil {
			return nil, "", "", fmt.Errorf("%s: %w", file, err)
		}
		return kp, file, server, nil
	}
	ns, name, ok := strings.Cut(configMap, "/")
	if !ok || ns == "" || name == "" {
		return nil, "", "", fmt.Errorf("--configmap %q: want namespace/name", configMap)
	}
	rc, err := operatorRESTConfig(kubeconfig)
	if err != nil {
		return nil, "", "", err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, "", "", fmt.Errorf("creating API client: %w", err)
	}
	cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, "", "", fmt.Errorf("reading ConfigMap %s: %w", configMap, err)
	}
	if kp, err = fromkubeproxy.FromConfigMap(cm); err != nil {
		return nil, "", "", err
	}
	if server, err = fromkubeproxy.APIServerFromConfigMap(cm); err != nil {
		return nil, "", "", err
	}
	return kp, "ConfigMap " + configMap, server, nil
}

// endpointValue is the value line of an environment variable in the replace overlay's
// apiserver-endpoint.yaml: "- name: NAME" and, on the next line, "value: ...".
func endpointValue(name string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^(\s*- name: ` + name + `\n\s*value: ).*$`)
}

// writeOverlay writes the converted configuration as dir/config.yaml and, when it
// replaces kube-proxy and kube-proxy's kubeconfig named the API server, sets the
// KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT of dir/apiserver-endpoint.yaml
// (a copy of deploy/overlays/replace-kube-proxy) to it. It says what it wrote.
func writeOverlay(w io.Writer, dir string, config []byte, opts fromkubeproxy.Options) error {
	if _, err := os.Stat(filepath.Join(dir, "kustomization.yaml")); err != nil {
		return fmt.Errorf("--write-overlay %s: not an overlay (a copy of deploy/overlays/...): %w", dir, err)
	}
	var patch []byte
	patchPath := filepath.Join(dir, "apiserver-endpoint.yaml")
	if !opts.Alongside && opts.APIServer != "" {
		host, port, err := fromkubeproxy.Endpoint(opts.APIServer)
		if err != nil {
			return err
		}
		if patch, err = os.ReadFile(patchPath); err != nil {
			return fmt.Errorf("--write-overlay without --alongside needs the replace overlay's apiserver-endpoint.yaml: %w", err)
		}
		for _, v := range []struct{ name, value string }{{"KUBERNETES_SERVICE_HOST", host}, {"KUBERNETES_SERVICE_PORT", strconv.Quote(port)}} {
			re := endpointValue(v.name)
			if !re.Match(patch) {
				return fmt.Errorf("%s sets no %s", patchPath, v.name)
			}
			patch = re.ReplaceAll(patch, []byte("${1}"+v.value))
		}
	}
	configPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(configPath, config, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(w, "wrote %s (its header says what it changed and what it could not carry)\n", configPath)
	if patch != nil {
		if err := os.WriteFile(patchPath, patch, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(w, "wrote %s: the API server %s\n", patchPath, opts.APIServer)
	}
	return nil
}
