// Command plot draws the benchmark's PNG plots from the samples bench/run.sh
// keeps:
//
//	plot -tps tps.txt -wakes wakelimit.txt -out bench/
//
// tps.txt has a line per pgbench run, "target clients tps"; it becomes
// throughput.png, the median TPS by client count, one line per target.
// wakelimit.txt (BenchmarkIntegrationWakeLimit's PGWAKE_BENCH_OUT) has a
// line per sample, "what step ms", what being raw, pgwake or one of
// pgwake's wake phases; it becomes wake-stop.png and wake-pause.png, box
// plots of each's distribution. An input left out is not drawn.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

func main() {
	tps := flag.String("tps", "", "pgbench runs: target clients tps, a line each")
	wakes := flag.String("wakes", "", "wake samples: what step ms, a line each")
	out := flag.String("out", ".", "directory the PNGs are written to")
	flag.Parse()
	if (*tps == "" && *wakes == "") || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*tps, *wakes, *out); err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
}

func run(tps, wakes, out string) error {
	if tps != "" {
		rows, err := readSamples(tps)
		if err != nil {
			return err
		}
		if err := throughput(rows, filepath.Join(out, "throughput.png")); err != nil {
			return err
		}
	}
	if wakes != "" {
		rows, err := readSamples(wakes)
		if err != nil {
			return err
		}
		for _, step := range []string{"stop", "pause"} {
			if err := wakeBoxes(rows, step, filepath.Join(out, "wake-"+step+".png")); err != nil {
				return err
			}
		}
	}
	return nil
}

// sample is one line of an input: two words and a number.
type sample struct {
	a, b string
	v    float64
}

func readSamples(path string) ([]sample, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []sample
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 3 {
			return nil, fmt.Errorf("%s:%d: want 3 fields, have %d", path, n, len(fields))
		}
		v, err := strconv.ParseFloat(fields[2], 64)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		if math.IsNaN(v) {
			// A pgbench run that did no transaction: left out, as in the
			// tables.
			continue
		}
		out = append(out, sample{fields[0], fields[1], v})
	}
	return out, sc.Err()
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// throughput draws median TPS by clients, a line per target.
func throughput(rows []sample, path string) error {
	by := map[string]map[float64][]float64{}
	var targets []string
	for _, r := range rows {
		c, err := strconv.ParseFloat(r.b, 64)
		if err != nil {
			return fmt.Errorf("clients %q: %w", r.b, err)
		}
		if by[r.a] == nil {
			by[r.a] = map[float64][]float64{}
			targets = append(targets, r.a)
		}
		by[r.a][c] = append(by[r.a][c], r.v)
	}
	if len(targets) == 0 {
		return fmt.Errorf("no pgbench runs to plot")
	}
	p := plot.New()
	p.Title.Text = "pgbench -S throughput (median of the runs)"
	p.X.Label.Text = "clients"
	p.Y.Label.Text = "transactions per second"
	p.Y.Min = 0
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	var lines []any
	for _, t := range targets {
		var cs []float64
		for c := range by[t] {
			cs = append(cs, c)
		}
		sort.Float64s(cs)
		pts := make(plotter.XYs, len(cs))
		for i, c := range cs {
			pts[i] = plotter.XY{X: c, Y: median(by[t][c])}
		}
		lines = append(lines, t, pts)
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return err
	}
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

// wakeOrder is the boxes of a wake plot, left to right: the limit, pgwake
// as a client sees it, then pgwake's own phases.
var wakeOrder = []string{"raw", "pgwake", "engine", "accept", "ready", "confirm"}

// wakeBoxes draws the distribution of each sample kind of one step.
func wakeBoxes(rows []sample, step, path string) error {
	vals := map[string]plotter.Values{}
	for _, r := range rows {
		if r.b == step {
			vals[r.a] = append(vals[r.a], r.v)
		}
	}
	p := plot.New()
	p.Title.Text = "wake from " + step + ": first row of SELECT 1, and pgwake's phases"
	p.Y.Label.Text = "ms"
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	var names []string
	for _, k := range wakeOrder {
		if len(vals[k]) == 0 {
			continue
		}
		b, err := plotter.NewBoxPlot(vg.Points(28), float64(len(names)), vals[k])
		if err != nil {
			return err
		}
		if k == "raw" {
			b.FillColor = color.RGBA{R: 200, G: 200, B: 200, A: 255}
		}
		p.Add(b)
		names = append(names, fmt.Sprintf("%s (n=%d)", k, len(vals[k])))
	}
	if len(names) == 0 {
		return fmt.Errorf("no wake samples from %s to plot", step)
	}
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.6, float64(len(names))-0.4 // room for the outer boxes
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}
