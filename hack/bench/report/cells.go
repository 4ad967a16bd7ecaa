package report

import (
	"fmt"
	"slices"
)

// Sample is one measured number.
type Sample struct {
	Round  int     `json:"round"`
	Config string  `json:"config"`
	Metric string  `json:"metric"`
	Value  float64 `json:"value"`
}

// Failure is a workload that produced no number in one round.
type Failure struct {
	Round    int    `json:"round"`
	Config   string `json:"config"`
	Workload string `json:"workload"`
	Error    string `json:"error"`
}

// Cell summarises one metric of one configuration over the rounds.
type Cell struct {
	Median float64  `json:"median"`
	Min    float64  `json:"min"`
	Max    float64  `json:"max"`
	N      int      `json:"n"`
	Ratio  *float64 `json:"ratio,omitempty"` // median / the ratio row's median
}

// Cells are the cells of a run by configuration, then metric.
type Cells map[string]map[string]*Cell

// Summarise computes every cell of samples; the ratios of a row's cells
// are to the row ratioTo names for it.
func Summarise(samples []Sample, ratioTo func(row string) string) Cells {
	vals := map[string]map[string][]float64{}
	for _, s := range samples {
		if vals[s.Config] == nil {
			vals[s.Config] = map[string][]float64{}
		}
		vals[s.Config][s.Metric] = append(vals[s.Config][s.Metric], s.Value)
	}
	out := Cells{}
	for cfg, ms := range vals {
		out[cfg] = map[string]*Cell{}
		for m, v := range ms {
			out[cfg][m] = &Cell{Median: Median(v), Min: slices.Min(v), Max: slices.Max(v), N: len(v)}
		}
	}
	for cfg, ms := range out {
		base := ratioTo(cfg)
		for m, c := range ms {
			if bc := out[base][m]; bc != nil && bc.Median != 0 {
				r := c.Median / bc.Median
				c.Ratio = &r
			}
		}
	}
	return out
}

// Median is the median of s, which it leaves alone.
func Median(s []float64) float64 {
	s = slices.Clone(s)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// FmtNum writes v with three significant digits or so.
func FmtNum(v float64) string {
	switch a := max(v, -v); {
	case a == 0:
		return "0"
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

func (c *Cell) String() string {
	s := FmtNum(c.Median)
	if c.N > 1 {
		s += fmt.Sprintf(" (%s–%s)", FmtNum(c.Min), FmtNum(c.Max))
	}
	if c.Ratio != nil {
		s += fmt.Sprintf(" ×%.2f", *c.Ratio)
	}
	return s
}
