package loadgen

import "testing"

func TestParseRedis(t *testing.T) {
	out := `"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"SET","124999.99","0.250","0.056","0.223","0.439","1.031","1.287"
"GET","133333.34","0.211","0.072","0.191","0.351","0.503","0.567"
`
	got, err := ParseRedis([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if got["set"] != [2]float64{124999.99, 0.223} || got["get"] != [2]float64{133333.34, 0.191} {
		t.Errorf("got %v, want SET {124999.99 0.223} and GET {133333.34 0.191}", got)
	}
	if _, err := ParseRedis([]byte("\"test\",\"rps\"\n\"SET\",\"1\"\n")); err == nil {
		t.Error("got no error for a header without p50_latency_ms")
	}
}

func TestParseAB(t *testing.T) {
	out := `Document Path:          /10m.bin
Document Length:        10485760 bytes
Complete requests:      100
Failed requests:        0
Requests per second:    86.12 [#/sec] (mean)
Transfer rate:          881234.12 [Kbytes/sec] received
`
	got, err := ParseAB([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	want := ABResult{RPS: 86.12, KBps: 881234.12, Complete: 100, Failed: 0, Length: 10485760}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if _, err := ParseAB([]byte("apr_pollset_poll: The timeout specified has expired (70007)")); err == nil {
		t.Error("got no error for a failed ab run")
	}
}

func TestParseIperf(t *testing.T) {
	gbps, retrans, bytes, err := ParseIperf([]byte(`{"end":{"sum_sent":{"retransmits":7},"sum_received":{"bits_per_second":9.5e9,"bytes":1.2e10}}}`))
	if err != nil || gbps != 9.5 || retrans != 7 || bytes != 1.2e10 {
		t.Errorf("got %v, %v, %v, %v; want 9.5, 7, 1.2e10, nil", gbps, retrans, bytes, err)
	}
	if _, _, _, err := ParseIperf([]byte(`{"error":"unable to connect to server"}`)); err == nil {
		t.Error("got no error for an iperf3 error")
	}
}
