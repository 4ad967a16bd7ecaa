// Package kube owns cni-usernet's few calls to the Kubernetes API server
// and the kubeconfig the node agent writes for the host-side plugin.
//
// It is a small client over net/http and encoding/json instead of
// client-go: the plugin is a short-lived binary run for every pod ADD, and
// client-go would multiply its size and start-up time for four requests.
package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Errors callers branch on with errors.Is.
var (
	// ErrUnreachable marks a request the API server did not serve: no
	// connection, no answer before the context ended, or an answer of 429
	// or 5xx. The condition is expected to clear, so the plugin reports
	// CNI code 11 (try again later) for it.
	ErrUnreachable = errors.New("kubernetes API server unreachable")
	// ErrNotFound marks a 404: the object (or its namespace) does not exist.
	ErrNotFound = errors.New("not found")
	// ErrUnauthorized marks a 401: the credentials were not accepted
	// (expired or revoked token, wrong client certificate).
	ErrUnauthorized = errors.New("unauthorized")
	// ErrForbidden marks a 403: the identity lacks the RBAC permission
	// the APIError names.
	ErrForbidden = errors.New("forbidden")
)

// DefaultUserAgent is sent when Config.UserAgent is empty.
const DefaultUserAgent = "cni-usernet"

// Size caps on what we read: a Node with many images is tens of KiB and a
// pod's annotations at most 256 KiB, so these only stop a broken server
// from making us buffer without bound.
const (
	maxBody      = 8 << 20
	maxErrorBody = 64 << 10
)

// dialTimeout bounds the TCP connect even when the caller's context is
// longer, so an address that drops SYNs fails as unreachable in time for
// the plugin to answer its runtime.
const dialTimeout = 5 * time.Second

// Config says how to reach and authenticate to one API server.
type Config struct {
	// Server is the API server's base URL, https://host[:port][/prefix].
	// Required.
	Server string
	// CAPEM holds the PEM certificates that may sign the server's
	// certificate. Empty means the system's roots.
	CAPEM []byte
	// TLSServerName is the name checked in the server's certificate.
	// Empty means the host of Server.
	TLSServerName string
	// Token is a bearer token. Empty means no token (or TokenFile).
	Token string
	// TokenFile names a file holding the bearer token. It is re-read
	// whenever it changes, because kubelet rotates projected service
	// account tokens in place. Empty means Token is used as is.
	TokenFile string
	// CertPEM and KeyPEM are a client certificate and its key, both or
	// neither. Empty means no client certificate.
	CertPEM, KeyPEM []byte
	// UserAgent is sent with every request. Empty means DefaultUserAgent.
	UserAgent string
}

// Validate reports the first problem that would make New fail before any
// request is sent.
func (c Config) Validate() error {
	if c.Server == "" {
		return errors.New("no API server URL")
	}
	u, err := url.Parse(c.Server)
	if err != nil {
		return fmt.Errorf("parsing API server URL %q: %w", c.Server, err)
	}
	// A bearer token in clear text would be readable by anyone on the
	// path, so plain http is refused rather than offered as an option.
	if u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("API server URL %q: want https://host[:port][/path]", c.Server)
	}
	if c.Token != "" && c.TokenFile != "" {
		return errors.New("both a token and a token file given")
	}
	if (len(c.CertPEM) == 0) != (len(c.KeyPEM) == 0) {
		return errors.New("a client certificate needs both certificate and key")
	}
	if len(c.CAPEM) > 0 {
		if !x509.NewCertPool().AppendCertsFromPEM(c.CAPEM) {
			return errors.New("CA data holds no PEM certificate")
		}
	}
	return nil
}

// Client talks to one API server. It is safe for concurrent use.
type Client struct {
	cfg       Config // as given to New, for a caller that builds another client alike
	base      *url.URL
	http      *http.Client
	token     tokenSource
	userAgent string
}

// New builds a client from cfg. It sends nothing: the first request is
// the first contact with the server.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("configuring the API client: %w", err)
	}
	base, _ := url.Parse(cfg.Server) // Validate parsed it already.
	base.Path = strings.TrimSuffix(base.Path, "/")
	base.RawPath = strings.TrimSuffix(base.RawPath, "/")

	tlsConf := &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: cfg.TLSServerName,
	}
	if len(cfg.CAPEM) > 0 {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(cfg.CAPEM)
		tlsConf.RootCAs = pool
	}
	if len(cfg.CertPEM) > 0 {
		cert, err := tls.X509KeyPair(cfg.CertPEM, cfg.KeyPEM)
		if err != nil {
			return nil, fmt.Errorf("loading the client certificate: %w", err)
		}
		tlsConf.Certificates = []tls.Certificate{cert}
	}
	transport := &http.Transport{
		// No proxy from the environment: the plugin inherits the
		// container runtime's environment, whose HTTP(S)_PROXY is meant
		// for image pulls, not for the cluster's own API server.
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tlsConf,
		TLSHandshakeTimeout: dialTimeout,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
	}

	var ts tokenSource = staticToken(cfg.Token)
	if cfg.TokenFile != "" {
		ft := &fileToken{path: cfg.TokenFile}
		// Read once now so a missing file is a configuration error here,
		// not a puzzling 401 later.
		if _, err := ft.get(false); err != nil {
			return nil, fmt.Errorf("configuring the API client: %w", err)
		}
		ts = ft
	}
	ua := cfg.UserAgent
	if ua == "" {
		ua = DefaultUserAgent
	}
	return &Client{
		cfg:       cfg,
		base:      base,
		http:      &http.Client{Transport: transport},
		token:     ts,
		userAgent: ua,
	}, nil
}

// Server returns the API server URL the client talks to.
func (c *Client) Server() string { return c.base.String() }

// Config is the configuration c was made from: the node agent's watches
// (client-go, which this package must not link) reach the same server
// with the same credentials.
func (c *Client) Config() Config { return c.cfg }

// request describes one call, for building it and for naming it in errors
// (the verb and resource are what an RBAC rule must grant).
type request struct {
	method    string
	verb      string // RBAC verb: get, create, ...
	group     string // API group, "" for core
	resource  string // plural resource: pods, nodes, events, ...
	namespace string
	name      string
	path      string
	accept    string
	body      []byte
}

func (r request) String() string {
	res := r.resource
	if r.group != "" {
		res += "." + r.group
	}
	switch {
	case r.namespace != "" && r.name != "":
		return fmt.Sprintf("%s %s %s/%s", r.verb, res, r.namespace, r.name)
	case r.namespace != "":
		return fmt.Sprintf("%s %s in namespace %s", r.verb, res, r.namespace)
	case r.name != "":
		return fmt.Sprintf("%s %s %s", r.verb, res, r.name)
	}
	return fmt.Sprintf("%s %s", r.verb, res)
}

// do sends r and decodes a 2xx answer into out (unless out is nil).
func (c *Client) do(ctx context.Context, r request, out any) error {
	resp, err := c.send(ctx, r, false)
	if err != nil {
		return err
	}
	if resp.StatusCode == http.StatusUnauthorized {
		// The token may have been rotated under us without the file's
		// metadata changing in a way we noticed; one retry with a fresh
		// read costs nothing when it has not.
		if _, changed, terr := c.token.refresh(); terr == nil && changed {
			drain(resp)
			if resp, err = c.send(ctx, r, true); err != nil {
				return err
			}
		}
	}
	defer drain(resp)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return apiErrorFrom(r, resp)
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxBody)).Decode(out); err != nil {
		return fmt.Errorf("%s: decoding the answer: %w", r, err)
	}
	return nil
}

func (c *Client) send(ctx context.Context, r request, fresh bool) (*http.Response, error) {
	// Both parts are already escaped: objectPath escapes each name.
	target := c.base.String() + r.path
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, target, body)
	if err != nil {
		return nil, fmt.Errorf("%s: building the request: %w", r, err)
	}
	accept := r.accept
	if accept == "" {
		accept = "application/json"
	}
	req.Header.Set("Accept", accept)
	req.Header.Set("User-Agent", c.userAgent)
	if r.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	tok, err := c.token.get(fresh)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r, err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if isCertError(err) {
			// A certificate that does not verify will not verify on the
			// next try either: a wrong CA or server name is a
			// configuration error, not "try again later".
			return nil, fmt.Errorf("%s: verifying the API server's certificate: %w", r, err)
		}
		return nil, fmt.Errorf("%s: %w: %w", r, ErrUnreachable, err)
	}
	return resp, nil
}

func isCertError(err error) bool {
	var verr *tls.CertificateVerificationError
	var uerr x509.UnknownAuthorityError
	var herr x509.HostnameError
	var ierr x509.CertificateInvalidError
	return errors.As(err, &verr) || errors.As(err, &uerr) || errors.As(err, &herr) || errors.As(err, &ierr)
}

// drain lets the transport reuse the connection.
func drain(resp *http.Response) {
	io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
	resp.Body.Close()
}

// APIError is an answer other than 2xx. errors.Is matches it against
// ErrNotFound (404), ErrUnauthorized (401), ErrForbidden (403) and
// ErrUnreachable (429 and 5xx).
type APIError struct {
	// What was asked, in RBAC terms.
	Verb, Group, Resource, Namespace, Name string
	// StatusCode is the HTTP status.
	StatusCode int
	// Reason and Message come from the metav1.Status body, when there
	// is one: Message names the user and the missing permission on 403.
	Reason, Message string
}

func (e *APIError) Error() string {
	r := request{verb: e.Verb, group: e.Group, resource: e.Resource, namespace: e.Namespace, name: e.Name}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", r, http.StatusText(e.StatusCode))
	if e.StatusCode != http.StatusTooManyRequests && e.StatusCode >= 500 {
		fmt.Fprintf(&b, " (%d, %s)", e.StatusCode, ErrUnreachable)
	} else if e.StatusCode == http.StatusTooManyRequests {
		fmt.Fprintf(&b, " (%s)", ErrUnreachable)
	}
	if e.Message != "" {
		fmt.Fprintf(&b, ": %s", e.Message)
	}
	switch e.StatusCode {
	case http.StatusForbidden:
		// The server's message already names the user; say what to
		// grant in the words of an RBAC rule.
		fmt.Fprintf(&b, " (grant verb %q on resource %q in API group %q", e.Verb, e.Resource, e.Group)
		if e.Namespace != "" {
			fmt.Fprintf(&b, " in namespace %q", e.Namespace)
		}
		b.WriteString(")")
	case http.StatusUnauthorized:
		b.WriteString(" (the token or client certificate was not accepted: expired, revoked or for another cluster)")
	}
	return b.String()
}

// Is maps the status to the package's sentinel errors.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrNotFound:
		return e.StatusCode == http.StatusNotFound
	case ErrUnauthorized:
		return e.StatusCode == http.StatusUnauthorized
	case ErrForbidden:
		return e.StatusCode == http.StatusForbidden
	case ErrUnreachable:
		return e.StatusCode == http.StatusTooManyRequests || e.StatusCode >= 500
	}
	return false
}

func apiErrorFrom(r request, resp *http.Response) *APIError {
	e := &APIError{
		Verb: r.verb, Group: r.group, Resource: r.resource,
		Namespace: r.namespace, Name: r.name,
		StatusCode: resp.StatusCode,
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var st struct {
		Kind    string `json:"kind"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &st) == nil && st.Kind == "Status" {
		e.Reason, e.Message = st.Reason, st.Message
	} else if s := strings.TrimSpace(string(body)); s != "" {
		// Proxies and load balancers in front of the API server answer
		// with text or HTML; a short excerpt still helps.
		if len(s) > 200 {
			s = s[:200] + "..."
		}
		e.Message = s
	}
	return e
}
