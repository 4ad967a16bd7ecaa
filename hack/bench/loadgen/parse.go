// Package loadgen is the side of the benchmark's workloads that needs no
// pods: its own TCP_RR client and server (the rr-client and rr-server
// roles), and the reading of iperf3's, redis-benchmark's and ab's output.
package loadgen

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/cni-usernet/cni-usernet/hack/bench/runlog"
)

// ParseIperf reads iperf3 -J: the receiver's rate and byte count, the
// sender's retransmits.
func ParseIperf(out []byte) (gbps, retrans, bytes float64, err error) {
	var res struct {
		Error string `json:"error"`
		End   struct {
			SumSent struct {
				Retransmits float64 `json:"retransmits"`
			} `json:"sum_sent"`
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
				Bytes         float64 `json:"bytes"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return 0, 0, 0, fmt.Errorf("parsing iperf3 output: %w", err)
	}
	if res.Error != "" {
		return 0, 0, 0, fmt.Errorf("iperf3: %s", res.Error)
	}
	if res.End.SumReceived.BitsPerSecond <= 0 {
		return 0, 0, 0, fmt.Errorf("iperf3 reported no throughput")
	}
	return res.End.SumReceived.BitsPerSecond / 1e9, res.End.SumSent.Retransmits, res.End.SumReceived.Bytes, nil
}

// ParseRedis reads redis-benchmark --csv: test → {rps, p50 ms}.
func ParseRedis(out []byte) (map[string][2]float64, error) {
	rows, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("parsing redis-benchmark output: %w", err)
	}
	if len(rows) < 1 {
		return nil, fmt.Errorf("redis-benchmark printed nothing")
	}
	col := func(name string) int { return slices.Index(rows[0], name) }
	rpsCol, p50Col := col("rps"), col("p50_latency_ms")
	if rpsCol < 0 || p50Col < 0 {
		return nil, fmt.Errorf("redis-benchmark CSV header %q lacks rps or p50_latency_ms", rows[0])
	}
	res := map[string][2]float64{}
	for _, row := range rows[1:] {
		rps, err1 := strconv.ParseFloat(row[rpsCol], 64)
		p50, err2 := strconv.ParseFloat(row[p50Col], 64)
		if err1 != nil || err2 != nil || rps <= 0 {
			return nil, fmt.Errorf("bad redis-benchmark row %q", row)
		}
		res[strings.ToLower(row[0])] = [2]float64{rps, p50}
	}
	if _, ok := res["set"]; !ok {
		return nil, fmt.Errorf("redis-benchmark reported no SET")
	}
	if _, ok := res["get"]; !ok {
		return nil, fmt.Errorf("redis-benchmark reported no GET")
	}
	return res, nil
}

// ABResult is what ParseAB reads of ab's report.
type ABResult struct{ RPS, KBps, Complete, Failed, Length float64 }

var abLine = regexp.MustCompile(`^(Requests per second|Transfer rate|Complete requests|Failed requests|Document Length):\s+([0-9.]+)`)

// ParseAB reads ab's report.
func ParseAB(out []byte) (ABResult, error) {
	var res ABResult
	seen := 0
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		m := abLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			return res, err
		}
		seen++
		switch m[1] {
		case "Requests per second":
			res.RPS = v
		case "Transfer rate":
			res.KBps = v
		case "Complete requests":
			res.Complete = v
		case "Failed requests":
			res.Failed = v
		case "Document Length":
			res.Length = v
		}
	}
	if seen < 5 {
		return res, fmt.Errorf("unexpected ab output: %s", runlog.Tail(string(out), 400))
	}
	return res, nil
}
