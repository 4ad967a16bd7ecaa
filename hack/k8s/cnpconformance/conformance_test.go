// SPDX-License-Identifier: Apache-2.0

// Package cnpconformance runs the upstream ClusterNetworkPolicy conformance
// suite (sigs.k8s.io/network-policy-api's conformance directory, at the
// version go.mod pins) against the cluster of KUBECONFIG and writes its
// report, for hack/k8s/cnp-conformance.sh. It is upstream's
// TestConformanceProfiles, its flags included (-conformance-profiles,
// -report-output, -organization, ...), with one change to the base
// manifests, made here at run time on upstream's own file: the SCTP servers
// (`agnhost porter` with SERVE_SCTP_PORT_*) stay up where the nodes' kernel
// has no SCTP. Upstream's exit there, and their pods, which every test
// needs, would never be Ready; the suite's SCTP tests still run and say
// what SCTP gets.
package cnpconformance

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/yaml"

	api "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/network-policy-api/conformance"
	"sigs.k8s.io/network-policy-api/conformance/tests"
	"sigs.k8s.io/network-policy-api/conformance/utils/flags"
	"sigs.k8s.io/network-policy-api/conformance/utils/suite"
)

const (
	porter     = `"/agnhost porter"`
	porterKept = `"/agnhost porter || exec sleep 2147483647"`
)

func TestCNPConformance(t *testing.T) {
	cfg, err := config.GetConfig()
	if err != nil {
		t.Fatalf("loading the Kubernetes configuration: %v", err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatalf("making the Kubernetes client: %v", err)
	}
	clientSet, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("making the Kubernetes clientset: %v", err)
	}
	if err := api.Install(c.Scheme()); err != nil {
		t.Fatalf("adding the ClusterNetworkPolicy API to the scheme: %v", err)
	}
	if err := apiextensionsv1.AddToScheme(c.Scheme()); err != nil {
		t.Fatalf("adding apiextensions to the scheme: %v", err)
	}

	// The suite reads its base manifests over https when their location is
	// a URL (and from its embedded files otherwise): serve upstream's own,
	// with the SCTP servers kept up, on loopback.
	base, err := conformance.Manifests.ReadFile("base/manifests.yaml")
	if err != nil {
		t.Fatalf("reading the suite's base manifests: %v", err)
	}
	kept := strings.ReplaceAll(string(base), porter, porterKept)
	if kept == string(base) {
		t.Fatalf("the suite's base/manifests.yaml runs no %s: the change for nodes without SCTP needs a look at this version", porter)
	}
	t.Logf("base manifests: %d SCTP servers kept up where the kernel has no SCTP (%s)", strings.Count(string(base), porter), porterKept)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(kept))
	}))
	t.Cleanup(srv.Close)
	http.DefaultClient = srv.Client()

	implementation, err := suite.ParseImplementation(*flags.ImplementationOrganization, *flags.ImplementationProject,
		*flags.ImplementationURL, *flags.ImplementationVersion, *flags.ImplementationContact,
		*flags.ImplementationAdditionalInformation)
	if err != nil {
		t.Fatalf("the implementation's flags: %v", err)
	}
	profiles := suite.ParseConformanceProfiles(*flags.ConformanceProfiles)
	if profiles.Len() == 0 {
		t.Fatal("-conformance-profiles names no profile (ClusterNetworkPolicy)")
	}
	cs, err := suite.NewConformanceProfileTestSuite(suite.ConformanceProfileOptions{
		Options: suite.Options{
			Client:                     c,
			ClientSet:                  clientSet,
			KubeConfig:                 *cfg,
			Debug:                      *flags.ShowDebug,
			BaseManifests:              srv.URL + "/base/manifests.yaml",
			CleanupBaseResources:       *flags.CleanupBaseResources,
			SupportedFeatures:          suite.ParseSupportedFeatures(*flags.SupportedFeatures),
			ExemptFeatures:             suite.ParseSupportedFeatures(*flags.ExemptFeatures),
			EnableAllSupportedFeatures: *flags.EnableAllSupportedFeatures,
		},
		Implementation:      *implementation,
		ConformanceProfiles: profiles,
	})
	if err != nil {
		t.Fatalf("making the conformance suite: %v", err)
	}
	cs.Setup(t)
	if err := cs.Run(t, tests.ConformanceTests); err != nil {
		t.Fatalf("running the conformance suite: %v", err)
	}
	report, err := cs.Report()
	if err != nil {
		t.Fatalf("making the conformance report: %v", err)
	}
	raw, err := yaml.Marshal(report)
	if err != nil {
		t.Fatalf("encoding the conformance report: %v", err)
	}
	t.Logf("conformance report:\n%s", raw)
	if *flags.ReportOutput != "" {
		if err := os.WriteFile(*flags.ReportOutput, raw, 0o644); err != nil {
			t.Fatalf("writing the conformance report: %v", err)
		}
	}
}
