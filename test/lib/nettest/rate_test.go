package nettest

import "testing"

func TestSteadyRate(t *testing.T) {
	for _, tc := range []struct {
		name      string
		rates     []float64
		mean      float64
		burstSecs int
		fails     bool
	}{
		{"burst then steady", []float64{2e9, 9e6, 10e6, 10e6, 10e6, 10e6, 10e6}, 10e6, 1, false},
		{"no burst", []float64{10e6, 10e6, 10e6, 10e6, 10e6, 12e6}, 10.4e6, 0, false},
		{"long burst", []float64{2e9, 1e9, 30e6, 11e6, 9e6, 10e6, 10e6, 10e6, 11e6}, 10e6, 3, false},
		{"too short after the burst", []float64{2e9, 10e6, 10e6, 10e6, 10e6}, 0, 1, true},
		{"never shaped", []float64{2e9, 2e9, 2e9, 2e9, 2e9, 2e9, 2e9}, 0, 7, true},
	} {
		mean, burst, err := SteadyRate(tc.rates, 10e6)
		if (err != nil) != tc.fails {
			t.Errorf("%s: error %v, want failure %v", tc.name, err, tc.fails)
		}
		if mean != tc.mean || len(burst) != tc.burstSecs {
			t.Errorf("%s: got mean %.0f after %d s of burst, want %.0f after %d", tc.name, mean, len(burst), tc.mean, tc.burstSecs)
		}
	}
}
