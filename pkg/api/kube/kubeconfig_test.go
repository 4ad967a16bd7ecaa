package kube

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/cni-usernet/cni-usernet/test/lib/fakeapi"
)

type testCA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a certificate and key signed by the CA, in PEM.
func (ca *testCA) issue(t *testing.T, cn string, usage x509.ExtKeyUsage, ips ...net.IP) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestWriteKubeconfig(t *testing.T) {
	srv, _ := tokenServer(t, "tok-1", "tok-2")
	ca := srv.CAPEM()
	dir := filepath.Join(t.TempDir(), "net.d", "cni-usernet.d")
	path := filepath.Join(dir, "kubeconfig")

	changed, err := WriteKubeconfig(path, srv.URL(), ca, "tok-1")
	if err != nil || !changed {
		t.Fatalf("first write: got %v, %v, want true, nil", changed, err)
	}
	assertMode(t, path, 0o600)
	assertMode(t, dir, 0o700|os.ModeDir)

	// The plugin's side: load it and make a request with it.
	c, err := LoadKubeconfig(path)
	if err != nil {
		t.Fatalf("LoadKubeconfig: %v", err)
	}
	if _, _, err := c.PodAnnotations(ctxTimeout(t, 2*time.Second), "n", "p"); err != nil {
		t.Fatalf("request with the written kubeconfig: %v", err)
	}

	if changed, err := WriteKubeconfig(path, srv.URL(), ca, "tok-1"); err != nil || changed {
		t.Errorf("same content again: got %v, %v, want false, nil", changed, err)
	}
	if changed, err := WriteKubeconfig(path, srv.URL(), ca, "tok-2"); err != nil || !changed {
		t.Errorf("new token: got %v, %v, want true, nil", changed, err)
	}
	assertMode(t, path, 0o600)
	cfg, err := ReadKubeconfig(path)
	if err != nil || cfg.Token != "tok-2" || cfg.Server != srv.URL() || string(cfg.CAPEM) != string(ca) {
		t.Errorf("read back: got %+v, %v, want token tok-2, the server and the CA", cfg, err)
	}

	// Someone loosened the mode: the same content is fixed, not skipped.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if changed, err := WriteKubeconfig(path, srv.URL(), ca, "tok-2"); err != nil || !changed {
		t.Errorf("same content, mode 0644: got %v, %v, want true, nil", changed, err)
	}
	assertMode(t, path, 0o600)

	// No stray temporary files next to it.
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("files in %s: got %d, want only the kubeconfig", dir, len(entries))
	}

	// kubectl must be able to read it too: it is JSON with the usual keys.
	var raw map[string]any
	data, _ := os.ReadFile(path)
	if err := json.Unmarshal(data, &raw); err != nil || raw["current-context"] != "cni-usernet" || raw["kind"] != "Config" {
		t.Errorf("written file: got %s, want a JSON kubeconfig with current-context cni-usernet", data)
	}
}

func TestWriteKubeconfigRefusesUnusable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	ca := newTestCA(t)
	for name, args := range map[string]struct {
		server, token string
		ca            []byte
	}{
		"empty token": {"https://10.96.0.1:443", "", ca.certPEM},
		"plain http":  {"http://10.96.0.1", "t", ca.certPEM},
		"bad CA":      {"https://10.96.0.1:443", "t", []byte("junk")},
	} {
		if _, err := WriteKubeconfig(path, args.server, args.ca, args.token); err == nil {
			t.Errorf("%s: got nil error", name)
		}
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("a refused kubeconfig was written: stat %v", err)
	}
}

func assertMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode() & (os.ModePerm | os.ModeDir); got != want {
		t.Errorf("mode of %s: got %v, want %v", path, got, want)
	}
}

// The lab cluster's admin kubeconfig: YAML, CA and client certificate in
// files, a flow mapping for the context.
func TestLoadKubeconfigYAMLClientCert(t *testing.T) {
	ca := newTestCA(t)
	srvCert, srvKey := ca.issue(t, "kube-apiserver", x509.ExtKeyUsageServerAuth, net.ParseIP("127.0.0.1"))
	cliCert, cliKey := ca.issue(t, "admin", x509.ExtKeyUsageClientAuth)
	pair, err := tls.X509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	srv := fakeapi.NewTest(t, fakeapi.Options{Cert: &pair, CAPEM: ca.certPEM, ClientCAs: pool})
	putPod(t, srv, "n", "p", "u", map[string]string{"a": "b"})

	dir := t.TempDir()
	pki := filepath.Join(dir, "pki")
	if err := os.Mkdir(pki, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(pki, "ca.crt"), ca.certPEM)
	writeFile(t, filepath.Join(pki, "admin.crt"), cliCert)
	writeFile(t, filepath.Join(pki, "admin.key"), cliKey)
	// Absolute CA path, relative client paths (relative to the file).
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: k8s-lab
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: admin
  user:
    client-certificate: pki/admin.crt
    client-key: pki/admin.key
contexts:
- name: k8s-lab
  context: {cluster: k8s-lab, user: admin}
current-context: k8s-lab
`, srv.URL(), filepath.Join(pki, "ca.crt"))
	path := filepath.Join(dir, "admin.kubeconfig")
	writeFile(t, path, []byte(kc))

	c, err := LoadKubeconfig(path)
	if err != nil {
		t.Fatalf("LoadKubeconfig: %v", err)
	}
	ann, _, err := c.PodAnnotations(ctxTimeout(t, 2*time.Second), "n", "p")
	if err != nil {
		t.Fatalf("PodAnnotations: %v", err)
	}
	var user string
	if reqs := srv.Requests(); len(reqs) > 0 {
		user = reqs[0].ClientCert
	}
	if user != "admin" || ann["a"] != "b" {
		t.Errorf("got client %q and annotations %v, want admin and a=b", user, ann)
	}
}

// What `kubectl config view --raw` prints: inline data, several contexts,
// empty flow collections, quoted strings, comments.
func TestReadKubeconfigKubectlStyle(t *testing.T) {
	ca := newTestCA(t)
	cert, key := ca.issue(t, "dev", x509.ExtKeyUsageClientAuth)
	b64 := func(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
	kc := `# written by kubectl
---
apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: ` + b64(ca.certPEM) + `
    server: https://10.242.0.1:6443
    tls-server-name: "kubernetes.default.svc"
  name: lab
- cluster:
    server: https://other.example:6443
  name: other
contexts:
- context:
    cluster: other
    user: other
  name: other
- context:
    cluster: lab
    namespace: kube-system
    user: dev
  name: 'dev@lab'
current-context: "dev@lab"   # the one we use
kind: Config
preferences: {}
users:
- name: other
  user:
    token: not-this-one
- name: dev
  user:
    client-certificate-data: ` + b64(cert) + `
    client-key-data: ` + b64(key) + `
`
	path := filepath.Join(t.TempDir(), "config")
	writeFile(t, path, []byte(kc))
	cfg, err := ReadKubeconfig(path)
	if err != nil {
		t.Fatalf("ReadKubeconfig: %v", err)
	}
	want := Config{
		Server: "https://10.242.0.1:6443", TLSServerName: "kubernetes.default.svc",
		CAPEM: ca.certPEM, CertPEM: cert, KeyPEM: key,
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("got %+v\nwant %+v", cfg, want)
	}
	if _, err := New(cfg); err != nil {
		t.Errorf("New: %v", err)
	}
}

func TestReadKubeconfigTokenFile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "tok"), []byte("from-file"))
	kc := `{"clusters":[{"name":"c","cluster":{"server":"https://a:6443"}}],
"users":[{"name":"u","user":{"tokenFile":"tok"}}],
"contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}]}`
	path := filepath.Join(dir, "kc.json")
	writeFile(t, path, []byte(kc))
	cfg, err := ReadKubeconfig(path)
	if err != nil {
		t.Fatalf("ReadKubeconfig: %v", err)
	}
	if cfg.TokenFile != filepath.Join(dir, "tok") || cfg.Token != "" {
		t.Errorf("got %+v, want the token file resolved next to the kubeconfig (the only context used)", cfg)
	}
}

func TestReadKubeconfigRefuses(t *testing.T) {
	base := func(cluster, user string) string {
		return `apiVersion: v1
clusters:
- name: c
  cluster:
    server: https://a:6443
` + cluster + `
users:
- name: u
  user:
` + user + `
contexts:
- name: x
  context: {cluster: c, user: u}
- name: y
  context: {cluster: c, user: u}
current-context: x
`
	}
	for _, tc := range []struct{ name, kc, want string }{
		{"exec plugin", base("", "    exec:\n      command: aws\n"), "exec credential plugins"},
		{"auth provider", base("", "    auth-provider:\n      name: oidc\n"), "auth-provider"},
		{"basic auth", base("", "    username: a\n    password: b\n"), "basic authentication"},
		{"insecure", base("    insecure-skip-tls-verify: true", "    token: t\n"), "insecure-skip-tls-verify"},
		{"missing context", strings.Replace(base("", "    token: t\n"), "current-context: x", "current-context: z", 1), `context "z" not found`},
		{"no current context", strings.Replace(base("", "    token: t\n"), "current-context: x", "", 1), "no current-context"},
		{"missing CA file", base("    certificate-authority: /nonexistent/ca.crt", "    token: t\n"), "certificate-authority"},
		{"not YAML", base("", "    token: 'abc\n"), "decoding YAML"},
		{"wrong type", base("", "    token: [a, b]\n"), "decoding YAML"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kc")
			writeFile(t, path, []byte(tc.kc))
			_, err := ReadKubeconfig(path)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

// TestDecodeKubeconfigYAML: the shapes kubectl, kubeadm, installers and
// people write, read as clientcmd reads them (sigs.k8s.io/yaml).
func TestDecodeKubeconfigYAML(t *testing.T) {
	user := func(u userInfo) *kubeconfigFile {
		return &kubeconfigFile{Users: []namedUser{{Name: "u", User: u}}}
	}
	for _, tc := range []struct {
		name, in string
		want     *kubeconfigFile
	}{
		{"empty", "# nothing\n", &kubeconfigFile{}},
		{"quoting and comments", "current-context: 'it''s' # mine\nkind: \"x\\ty\\u00e9 # not a comment\"\n",
			&kubeconfigFile{CurrentContext: "it's", Kind: "x\ty\u00e9 # not a comment"}},
		{"sequence at key indent", "users:\n- name: u\n  user:\n    token: t\n", user(userInfo{Token: "t"})},
		{"sequence indented", "users:\n  - name: u\n    user:\n      token: t\n", user(userInfo{Token: "t"})},
		{"flow", "users: [{name: u, user: {token: \"t\", tokenFile: f}}]\n", user(userInfo{Token: "t", TokenFile: "f"})},
		{"block scalar", "users:\n- name: u\n  user:\n    token: |-\n      abc\n", user(userInfo{Token: "abc"})},
		{"quoted number stays", "users:\n- name: u\n  user: {token: \"0600\"}\n", user(userInfo{Token: "0600"})},
		// As kubectl: YAML 1.1 reads a plain 0600 as octal; tools that
		// write kubeconfigs quote such values.
		{"plain number as kubectl", "users:\n- name: u\n  user: {token: 0600}\n", user(userInfo{Token: "384"})},
		{"base64 data", "users:\n- name: u\n  user:\n    client-key-data: aGk=\n", user(userInfo{ClientKeyData: []byte("hi")})},
		{"exec kept to refuse it", "users:\n- name: u\n  user:\n    exec:\n      command: aws\n",
			user(userInfo{Exec: json.RawMessage(`{"command":"aws"}`)})},
		{"document marker", "---\ncurrent-context: x\n", &kubeconfigFile{CurrentContext: "x"}},
		{"crlf and bom", "\uFEFFcurrent-context: x\r\nkind: Config\r\n", &kubeconfigFile{CurrentContext: "x", Kind: "Config"}},
		{"json", `{"current-context": "x", "users": [{"name": "u", "user": {"token": "t"}}]}`,
			&kubeconfigFile{CurrentContext: "x", Users: []namedUser{{Name: "u", User: userInfo{Token: "t"}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeKubeconfig([]byte(tc.in))
			if err != nil {
				t.Fatalf("decodeKubeconfig: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestDecodeKubeconfigYAMLErrors(t *testing.T) {
	for _, tc := range []struct{ name, in string }{
		{"tab indent", "users:\n\t- name: u\n"},
		{"unterminated quote", "current-context: 'x\n"},
		{"bad indent", "users:\n    - name: u\n  - name: v\n"},
		{"string for a list", "users: u\n"},
		{"list for a string", "current-context: [a]\n"},
		{"bad base64", "users:\n- name: u\n  user: {client-key-data: '!!'}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, err := decodeKubeconfig([]byte(tc.in)); err == nil {
				t.Errorf("got %+v, nil, want an error", got)
			}
		})
	}
}

// yamlQuote writes s as a YAML double-quoted scalar with everything
// outside printable ASCII escaped, so that any string can be written.
func yamlQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r >= 0x20 && r < 0x7f:
			b.WriteRune(r)
		case r <= 0xffff:
			fmt.Fprintf(&b, "\\u%04x", r)
		default:
			fmt.Fprintf(&b, "\\U%08x", r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// FuzzKubeconfigYAML writes a kubeconfig in the lab's and kubectl's
// block style with fuzzed names and values and reads it back: the result,
// Config or error, must be what the same kubeconfig gives as JSON, and the
// values must come back as written.
func FuzzKubeconfigYAML(f *testing.F) {
	f.Add("https://10.0.0.1:6443", "lab", "admin", "tok", "ns")
	f.Add("https://h:1/p?q=1#frag", "a # b", "y", "0600", "")
	f.Add("", "x", "x", "'t'", "\u00e9\n\t")
	f.Fuzz(func(t *testing.T, server, ctxName, userName, token, namespace string) {
		for _, s := range []string{server, ctxName, userName, token, namespace} {
			if !utf8.ValidString(s) {
				return // JSON would replace the invalid bytes, YAML not
			}
		}
		want := &kubeconfigFile{
			APIVersion: "v1", Kind: "Config",
			Clusters:       []namedCluster{{Name: "c", Cluster: clusterInfo{Server: server}}},
			Users:          []namedUser{{Name: userName, User: userInfo{Token: token}}},
			Contexts:       []namedContext{{Name: ctxName, Context: contextInfo{Cluster: "c", User: userName, Namespace: namespace}}},
			CurrentContext: ctxName,
		}
		q := yamlQuote
		y := "apiVersion: v1\nkind: Config\n# a comment\nclusters:\n- name: c\n  cluster:\n    server: " + q(server) +
			"\nusers:\n- name: " + q(userName) + "\n  user:\n    token: " + q(token) +
			"\ncontexts:\n- name: " + q(ctxName) + "\n  context: {cluster: c, user: " + q(userName) + ", namespace: " + q(namespace) + "}" +
			"\ncurrent-context: " + q(ctxName) + " # the one\n"
		got, err := decodeKubeconfig([]byte(y))
		if err != nil {
			t.Fatalf("decoding:\n%s\n%v", y, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decoding:\n%s\ngot  %+v\nwant %+v", y, got, want)
		}
		j, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		fromJSON, err := decodeKubeconfig(j)
		if err != nil {
			t.Fatalf("decoding JSON %s: %v", j, err)
		}
		cy, erry := got.config("/nonexistent")
		cj, errj := fromJSON.config("/nonexistent")
		if !reflect.DeepEqual(cy, cj) || fmt.Sprint(erry) != fmt.Sprint(errj) {
			t.Fatalf("resolving: YAML gave %+v, %v; JSON gave %+v, %v", cy, erry, cj, errj)
		}
	})
}
