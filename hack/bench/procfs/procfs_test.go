package procfs

import "testing"

func TestParseStatusRSS(t *testing.T) {
	got, err := parseStatusRSS([]byte("Name:\tcni-usernet-st\nVmRSS:\t   14404 kB\nRssAnon:\t    3020 kB\nRssFile:\t   11384 kB\nRssShmem:\t       0 kB\n"))
	if want := (RSS{14404 * 1024, 3020 * 1024, 11384 * 1024}); err != nil || got != want {
		t.Errorf("got %+v, %v; want %+v, nil", got, err, want)
	}
	if _, err := parseStatusRSS([]byte("VmRSS:\t1 kB\n")); err == nil {
		t.Error("got no error without RssAnon and RssFile")
	}
}

func TestParseSmapsRollup(t *testing.T) {
	raw := []byte(`55d0c0000000-7ffd5b3f1000 ---p 00000000 00:00 0                          [rollup]
Rss:               14920 kB
Pss:                4410 kB
Pss_Dirty:          3900 kB
Pss_Anon:           3890 kB
Pss_File:            520 kB
Pss_Shmem:             0 kB
`)
	s, err := parseSmapsRollup(raw)
	if err != nil || s.Rss != 14920*1024 || s.Pss != 4410*1024 || s.PssAnon != 3890*1024 || s.PssFile != 520*1024 {
		t.Errorf("got %+v, %v; want Rss 14920 kB, Pss 4410 kB, Pss_Anon 3890 kB, Pss_File 520 kB", s, err)
	}
	if _, err := parseSmapsRollup([]byte("Swap: 0 kB\n")); err == nil {
		t.Error("got no error for smaps_rollup without Rss and Pss")
	}
}
