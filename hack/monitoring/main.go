// Command monitoring-check checks the dashboards and alert rules in
// config/monitoring against the metrics the library exports: every PromQL
// expression must parse with Prometheus's own parser (rule files are loaded
// as Prometheus loads them), and every metric it selects must be one the
// library exports. A renamed metric fails the check.
//
//	monitoring-check -exported metrics.txt file.json file.yaml ...
//
// The exported metrics are the library's registry in the OpenMetrics text
// format; their names come from its `# TYPE` lines, with the sample names
// each type has (`_total` for counters; `_bucket`, `_sum`, `_count` for
// histograms).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	exportedPath := flag.String("exported", "", "the library's metrics in the OpenMetrics text format")
	flag.Parse()
	if *exportedPath == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: monitoring-check -exported metrics.txt file.json|file.yaml ...")
		os.Exit(2)
	}
	exported, err := exportedNames(*exportedPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	p := parser.NewParser(parser.Options{})
	var problems []string
	checked := 0
	for _, file := range flag.Args() {
		exprs, errs := expressions(file, p)
		for _, err := range errs {
			problems = append(problems, err.Error())
		}
		for _, e := range exprs {
			checked++
			for _, name := range selected(e.expr, p, &problems, e.where) {
				if !exported[name] {
					problems = append(problems, fmt.Sprintf("%s: %s is not a metric the library exports", e.where, name))
				}
			}
		}
	}
	if len(problems) > 0 {
		for _, problem := range problems {
			fmt.Fprintln(os.Stderr, problem)
		}
		os.Exit(1)
	}
	fmt.Printf("%d expressions checked against %d exported series names\n", checked, len(exported))
}

// exportedNames reads the sample names the library's registry exports.
func exportedNames(path string) (map[string]bool, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	names := map[string]bool{}
	scanner := bufio.NewScanner(file)
	for scanner.Scan() {
		fields := strings.Fields(scanner.Text())
		if len(fields) != 4 || fields[0] != "#" || fields[1] != "TYPE" {
			continue
		}
		name, kind := fields[2], fields[3]
		switch kind {
		case "counter":
			names[name+"_total"] = true
		case "histogram":
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				names[name+suffix] = true
			}
		default:
			names[name] = true
		}
	}
	if err := scanner.Err(); err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%s names no metrics (no # TYPE lines)", path)
	}
	return names, nil
}

type expression struct {
	where string
	expr  string
}

// expressions gives the PromQL expressions of a Grafana dashboard (every
// "expr" in it) or of a Prometheus rule file (loaded as Prometheus loads it,
// which checks the expressions' syntax too).
func expressions(file string, p parser.Parser) ([]expression, []error) {
	if strings.HasSuffix(file, ".json") {
		content, err := os.ReadFile(file)
		if err != nil {
			return nil, []error{err}
		}
		var dashboard any
		if err := json.Unmarshal(content, &dashboard); err != nil {
			return nil, []error{fmt.Errorf("%s: %w", file, err)}
		}
		var found []expression
		collect(dashboard, file, &found)
		if len(found) == 0 {
			return nil, []error{fmt.Errorf("%s: no expressions found", file)}
		}
		return found, nil
	}
	groups, errs := rulefmt.ParseFile(file, false, model.UTF8Validation, p, slog.Default())
	if len(errs) > 0 {
		return nil, errs
	}
	var found []expression
	for _, group := range groups.Groups {
		for _, rule := range group.Rules {
			name := rule.Alert + rule.Record
			found = append(found, expression{fmt.Sprintf("%s: group %s, rule %s", file, group.Name, name), rule.Expr})
		}
	}
	if len(found) == 0 {
		return nil, []error{fmt.Errorf("%s: no rules found", file)}
	}
	return found, nil
}

// collect walks a dashboard for "expr" fields, naming each by its panel.
func collect(node any, where string, found *[]expression) {
	switch value := node.(type) {
	case map[string]any:
		if title, ok := value["title"].(string); ok {
			where = where + ": " + title
		}
		if expr, ok := value["expr"].(string); ok {
			*found = append(*found, expression{where, expr})
		}
		// A template variable's query: label_values(<selector>, <label>).
		if definition, ok := value["definition"].(string); ok {
			inner := strings.TrimSuffix(strings.TrimPrefix(definition, "label_values("), ")")
			if cut := strings.LastIndex(inner, ","); inner != definition && cut > 0 {
				*found = append(*found, expression{where + " (variable)", inner[:cut]})
			}
		}
		keys := make([]string, 0, len(value))
		for key := range value {
			keys = append(keys, key)
		}
		sort.Strings(keys)
		for _, key := range keys {
			collect(value[key], where, found)
		}
	case []any:
		for _, item := range value {
			collect(item, where, found)
		}
	}
}

// Grafana's variables, replaced by values of their kind before parsing.
var grafanaVariables = strings.NewReplacer(
	"$__rate_interval", "5m",
	"$__interval", "1m",
	"$__range", "1h",
	"${controller:regex}", "x",
	"$controller", "x",
	"${cluster:regex}", "x",
	"$cluster", "x",
)

// selected parses expr and gives the metric names it selects.
func selected(expr string, p parser.Parser, problems *[]string, where string) []string {
	parsed, err := p.ParseExpr(grafanaVariables.Replace(expr))
	if err != nil {
		*problems = append(*problems, fmt.Sprintf("%s: %q does not parse: %v", where, expr, err))
		return nil
	}
	var names []string
	parser.Inspect(parsed, func(node parser.Node, _ []parser.Node) error {
		if selector, ok := node.(*parser.VectorSelector); ok {
			if selector.Name == "" {
				*problems = append(*problems, fmt.Sprintf("%s: %q selects by labels only; name the metric", where, expr))
			}
			names = append(names, selector.Name)
		}
		return nil
	})
	return names
}
