// Package promcheck reads and lints a Prometheus scrape for the tests of
// the node agent's metrics: promlint (the linter `promtool check metrics`
// runs) always, and promtool itself when one is built (`make promtool`).
package promcheck

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape is one parsed scrape.
type Scrape struct {
	Body     []byte
	Families map[string]*dto.MetricFamily
}

// Get scrapes url with client (nil: a default one).
func Get(client *http.Client, url string) (*Scrape, error) {
	if client == nil {
		client = &http.Client{Timeout: 15 * time.Second}
	}
	resp, err := client.Get(url)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping %s: %s\n%s", url, resp.Status, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		return nil, fmt.Errorf("scraping %s: content type %q, want the text exposition format", url, ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parsing the scrape of %s: %w", url, err)
	}
	return &Scrape{Body: body, Families: fams}, nil
}

// Promtool returns the promtool binary to check with: $PROMTOOL, else the
// repository's bin/promtool; "" when neither exists.
func Promtool() string {
	if p := os.Getenv("PROMTOOL"); p != "" {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(file)
	for ; filepath.Dir(root) != root; root = filepath.Dir(root) {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
	}
	p := filepath.Join(root, "bin", "promtool")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// Lint returns the problems promlint finds in the scrape and, when
// promtool is at hand, those of `promtool check metrics`; checked says
// which ran.
func (s *Scrape) Lint() (problems []string, checked string, err error) {
	ps, err := promlint.New(bytes.NewReader(s.Body)).Lint()
	if err != nil {
		return nil, "", fmt.Errorf("promlint: %w", err)
	}
	for _, p := range ps {
		problems = append(problems, fmt.Sprintf("promlint: %s: %s", p.Metric, p.Text))
	}
	checked = "promlint"
	tool := Promtool()
	if tool == "" {
		return problems, checked, nil
	}
	cmd := exec.Command(tool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(s.Body)
	out, err := cmd.CombinedOutput()
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			return problems, checked, fmt.Errorf("running %s: %w", tool, err)
		}
		problems = append(problems, "promtool check metrics: "+strings.TrimSpace(string(out)))
	}
	return problems, checked + " and " + tool + " check metrics", nil
}

// Find returns the samples of family name whose labels include want.
func (s *Scrape) Find(name string, want map[string]string) []*dto.Metric {
	var found []*dto.Metric
	for _, m := range s.Families[name].GetMetric() {
		if Matches(m, want) {
			found = append(found, m)
		}
	}
	return found
}

// Matches reports whether m carries every label of want.
func Matches(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// Labels returns m's labels as a map.
func Labels(m *dto.Metric) map[string]string {
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	return labels
}

// Value is a counter's or gauge's value.
func Value(m *dto.Metric) float64 {
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// Grep returns the scrape's lines that contain sub.
func (s *Scrape) Grep(sub string) string {
	var out []string
	for _, l := range strings.Split(string(s.Body), "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
