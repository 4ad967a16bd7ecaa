package kube

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"

	"github.com/cni-usernet/cni-usernet/pkg/util/atomicfile"
)

// DefaultKubeconfig is where the agent writes, and the plugin reads, the
// plugin's kubeconfig: a directory of its own under /etc/cni/net.d, because
// runtimes load every *.conf, *.conflist and *.json file directly in
// /etc/cni/net.d as a network configuration, and the directory can be
// 0700 while net.d stays readable.
const DefaultKubeconfig = "/etc/cni/net.d/cni-usernet.d/kubeconfig"

// kubeconfigName names the single cluster, user and context written.
const kubeconfigName = "cni-usernet"

// kubeconfigFile is the part of a kubeconfig (clientcmd's v1.Config) we
// read and write.
type kubeconfigFile struct {
	APIVersion     string         `json:"apiVersion,omitempty"`
	Kind           string         `json:"kind,omitempty"`
	Clusters       []namedCluster `json:"clusters"`
	Users          []namedUser    `json:"users"`
	Contexts       []namedContext `json:"contexts"`
	CurrentContext string         `json:"current-context"`
}

type namedCluster struct {
	Name    string      `json:"name"`
	Cluster clusterInfo `json:"cluster"`
}

type clusterInfo struct {
	Server                   string `json:"server"`
	TLSServerName            string `json:"tls-server-name,omitempty"`
	InsecureSkipTLSVerify    bool   `json:"insecure-skip-tls-verify,omitempty"`
	CertificateAuthority     string `json:"certificate-authority,omitempty"`
	CertificateAuthorityData []byte `json:"certificate-authority-data,omitempty"`
	ProxyURL                 string `json:"proxy-url,omitempty"`
}

type namedUser struct {
	Name string   `json:"name"`
	User userInfo `json:"user"`
}

type userInfo struct {
	Token                 string `json:"token,omitempty"`
	TokenFile             string `json:"tokenFile,omitempty"`
	ClientCertificate     string `json:"client-certificate,omitempty"`
	ClientCertificateData []byte `json:"client-certificate-data,omitempty"`
	ClientKey             string `json:"client-key,omitempty"`
	ClientKeyData         []byte `json:"client-key-data,omitempty"`
	// Present only to refuse them by name instead of failing with 401.
	Username     string          `json:"username,omitempty"`
	Exec         json.RawMessage `json:"exec,omitempty"`
	AuthProvider json.RawMessage `json:"auth-provider,omitempty"`
}

type namedContext struct {
	Name    string      `json:"name"`
	Context contextInfo `json:"context"`
}

type contextInfo struct {
	Cluster   string `json:"cluster"`
	User      string `json:"user"`
	Namespace string `json:"namespace,omitempty"`
}

// LoadKubeconfig builds a client from a kubeconfig file: the one
// WriteKubeconfig writes (JSON), or a usual YAML one with its current
// context's server, CA (data or file), and token, token file or client
// certificate and key (data or files). Exec plugins, auth providers,
// basic auth, proxies and insecure-skip-tls-verify are refused.
func LoadKubeconfig(path string) (*Client, error) {
	cfg, err := ReadKubeconfig(path)
	if err != nil {
		return nil, err
	}
	c, err := New(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return c, nil
}

// ReadKubeconfig is the Config LoadKubeconfig uses.
func ReadKubeconfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("reading kubeconfig: %w", err)
	}
	kc, err := decodeKubeconfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	cfg, err := kc.config(filepath.Dir(path))
	if err != nil {
		return Config{}, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return cfg, nil
}

// decodeKubeconfig reads a kubeconfig in JSON (what WriteKubeconfig
// writes) or YAML (what kubectl, kubeadm and installers write).
// sigs.k8s.io/yaml converts YAML to JSON guided by kubeconfigFile's types,
// so one set of json tags serves both formats and a plain scalar that
// looks like a number or a boolean stays a string where a string is
// expected, as with clientcmd.
func decodeKubeconfig(data []byte) (*kubeconfigFile, error) {
	var kc kubeconfigFile
	if t := bytes.TrimLeft(data, " \t\r\n\uFEFF"); len(t) > 0 && t[0] == '{' {
		if err := json.Unmarshal(data, &kc); err != nil {
			return nil, fmt.Errorf("decoding JSON: %w", err)
		}
		return &kc, nil
	}
	if err := yaml.Unmarshal(data, &kc); err != nil {
		return nil, fmt.Errorf("decoding YAML: %w", err)
	}
	return &kc, nil
}

// config resolves the current context; relative file names are relative
// to dir, the kubeconfig's directory, as kubectl takes them.
func (kc *kubeconfigFile) config(dir string) (Config, error) {
	ctxName := kc.CurrentContext
	if ctxName == "" && len(kc.Contexts) == 1 {
		ctxName = kc.Contexts[0].Name
	}
	if ctxName == "" {
		return Config{}, errors.New("no current-context")
	}
	var ctx *contextInfo
	for i := range kc.Contexts {
		if kc.Contexts[i].Name == ctxName {
			ctx = &kc.Contexts[i].Context
		}
	}
	if ctx == nil {
		return Config{}, fmt.Errorf("context %q not found", ctxName)
	}
	var cl *clusterInfo
	for i := range kc.Clusters {
		if kc.Clusters[i].Name == ctx.Cluster {
			cl = &kc.Clusters[i].Cluster
		}
	}
	if cl == nil {
		return Config{}, fmt.Errorf("cluster %q of context %q not found", ctx.Cluster, ctxName)
	}
	var u *userInfo
	for i := range kc.Users {
		if kc.Users[i].Name == ctx.User {
			u = &kc.Users[i].User
		}
	}
	if u == nil && ctx.User != "" {
		return Config{}, fmt.Errorf("user %q of context %q not found", ctx.User, ctxName)
	}
	if u == nil {
		u = &userInfo{}
	}

	switch {
	case cl.InsecureSkipTLSVerify:
		return Config{}, errors.New("insecure-skip-tls-verify is not supported: give the CA")
	case cl.ProxyURL != "":
		return Config{}, errors.New("proxy-url is not supported")
	case present(u.Exec):
		return Config{}, errors.New("exec credential plugins are not supported: use a token or client certificate")
	case present(u.AuthProvider):
		return Config{}, errors.New("auth-provider is not supported: use a token or client certificate")
	case u.Username != "":
		return Config{}, errors.New("basic authentication is not supported: use a token or client certificate")
	}

	cfg := Config{Server: cl.Server, TLSServerName: cl.TLSServerName, Token: u.Token}
	var err error
	if cfg.CAPEM, err = dataOrFile(cl.CertificateAuthorityData, cl.CertificateAuthority, dir); err != nil {
		return Config{}, fmt.Errorf("reading certificate-authority: %w", err)
	}
	if cfg.CertPEM, err = dataOrFile(u.ClientCertificateData, u.ClientCertificate, dir); err != nil {
		return Config{}, fmt.Errorf("reading client-certificate: %w", err)
	}
	if cfg.KeyPEM, err = dataOrFile(u.ClientKeyData, u.ClientKey, dir); err != nil {
		return Config{}, fmt.Errorf("reading client-key: %w", err)
	}
	// kubectl prefers an inline token over a token file.
	if cfg.Token == "" && u.TokenFile != "" {
		cfg.TokenFile = resolve(dir, u.TokenFile)
	}
	return cfg, nil
}

func present(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && !bytes.Equal(t, []byte("null"))
}

func resolve(dir, name string) string {
	if filepath.IsAbs(name) {
		return name
	}
	return filepath.Join(dir, name)
}

// dataOrFile returns inline data if any, else the named file's contents.
func dataOrFile(data []byte, file, dir string) ([]byte, error) {
	if len(data) > 0 || file == "" {
		return data, nil
	}
	return os.ReadFile(resolve(dir, file))
}

// WriteKubeconfig writes the host-side plugin's kubeconfig: one cluster
// (server, CA), one user (bearer token), one context. The file is JSON
// (which is also YAML, so kubectl reads it), mode 0600 because it holds a
// credential, replaced atomically so the plugin never reads half of it;
// a missing parent directory is created 0700. Writing what is already
// there changes nothing and returns false.
func WriteKubeconfig(path string, server string, caPEM []byte, token string) (bool, error) {
	if token == "" {
		return false, errors.New("writing kubeconfig: empty token")
	}
	// Validate as New would, so that a file the plugin cannot use is
	// never written.
	if err := (Config{Server: server, CAPEM: caPEM, Token: token}).Validate(); err != nil {
		return false, fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	kc := kubeconfigFile{
		APIVersion: "v1",
		Kind:       "Config",
		Clusters: []namedCluster{{Name: kubeconfigName, Cluster: clusterInfo{
			Server: server, CertificateAuthorityData: caPEM,
		}}},
		Users:          []namedUser{{Name: kubeconfigName, User: userInfo{Token: token}}},
		Contexts:       []namedContext{{Name: kubeconfigName, Context: contextInfo{Cluster: kubeconfigName, User: kubeconfigName}}},
		CurrentContext: kubeconfigName,
	}
	data, err := json.MarshalIndent(kc, "", "  ")
	if err != nil {
		return false, fmt.Errorf("encoding kubeconfig: %w", err)
	}
	data = append(data, '\n')

	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		fi, err := os.Stat(path)
		if err != nil {
			return false, fmt.Errorf("checking kubeconfig %s: %w", path, err)
		}
		if fi.Mode().Perm() == 0o600 {
			return false, nil
		}
		if err := os.Chmod(path, 0o600); err != nil {
			return false, fmt.Errorf("restricting kubeconfig %s to its owner: %w", path, err)
		}
		return true, nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("reading kubeconfig %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return false, fmt.Errorf("creating the kubeconfig's directory: %w", err)
	}
	if err := atomicfile.Write(path, data, 0o600); err != nil {
		return false, fmt.Errorf("writing kubeconfig: %w", err)
	}
	return true, nil
}
