// Command client-go-requests is the Go side of the kubeconfig fleet
// bench's request round (providers/kubeconfig/benches/fleet.rs): the same
// work through client-go, so that the two libraries' cost per request is
// read on one machine against one API server.
//
// From one kubeconfig (or, with -kubeconfigs, one per cluster: a client
// certificate each, so that no two share a transport) it builds a client
// per cluster as Go's multicluster-runtime kubeconfig provider does (a
// rest.Config each, rest.HTTPClientFor; client-go itself shares the
// transport of identical TLS configurations), sends each one request to open its connections,
// then reads the process's CPU time around the round: every cluster sends
// -requests GETs of /version one after another, -parallel clusters at
// once, each answer read whole. Client-side rate limiting is off (QPS -1):
// client-go's default of 5 a second would measure the limiter, and the
// Rust client has none unless a budget is set.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

func cpuSeconds() float64 {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		return 0
	}
	seconds := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return seconds(usage.Utime) + seconds(usage.Stime)
}

// each runs work(i) for every cluster, parallel at once, and counts the
// failures.
func each(clusters, parallel int, work func(int) int) int64 {
	var failed atomic.Int64
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < parallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				failed.Add(int64(work(i)))
			}
		}()
	}
	for i := 0; i < clusters; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	return failed.Load()
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the kubeconfig every cluster is built from")
	kubeconfigs := flag.String("kubeconfigs", "", "a directory of kubeconfigs, one per cluster (instead of -kubeconfig)")
	clusters := flag.Int("clusters", 1000, "clusters, each with its own client")
	requests := flag.Int("requests", 100, "GETs of /version per cluster")
	parallel := flag.Int("parallel", 64, "clusters sending at once")
	flag.Parse()

	paths := make([]string, *clusters)
	for i := range paths {
		paths[i] = *kubeconfig
	}
	if *kubeconfigs != "" {
		found, err := filepath.Glob(filepath.Join(*kubeconfigs, "*.yaml"))
		if err != nil || len(found) < *clusters {
			fmt.Fprintf(os.Stderr, "%s holds %d kubeconfigs, fewer than the %d clusters (%v)\n", *kubeconfigs, len(found), *clusters, err)
			os.Exit(1)
		}
		sort.Strings(found)
		copy(paths, found)
	}

	clients := make([]rest.Interface, *clusters)
	for i := range clients {
		config, err := clientcmd.BuildConfigFromFlags("", paths[i])
		if err != nil {
			fmt.Fprintf(os.Stderr, "reading kubeconfig %q: %v\n", paths[i], err)
			os.Exit(1)
		}
		config.QPS = -1
		httpClient, err := rest.HTTPClientFor(config)
		if err != nil {
			fmt.Fprintf(os.Stderr, "cluster %d: %v\n", i, err)
			os.Exit(1)
		}
		client, err := discovery.NewDiscoveryClientForConfigAndClient(config, httpClient)
		if err != nil {
			fmt.Fprintf(os.Stderr, "cluster %d: %v\n", i, err)
			os.Exit(1)
		}
		clients[i] = client.RESTClient()
	}

	ctx := context.Background()
	get := func(i, times int) int {
		failed := 0
		for n := 0; n < times; n++ {
			if _, err := clients[i].Get().AbsPath("/version").Do(ctx).Raw(); err != nil {
				failed++
			}
		}
		return failed
	}
	if failed := each(*clusters, *parallel, func(i int) int { return get(i, 1) }); failed > 0 {
		fmt.Fprintf(os.Stderr, "%d clusters could not be reached before the round\n", failed)
		os.Exit(1)
	}

	cpuBefore, started := cpuSeconds(), time.Now()
	failed := each(*clusters, *parallel, func(i int) int { return get(i, *requests) })
	wall, cpu := time.Since(started).Seconds(), cpuSeconds()-cpuBefore
	total := *clusters * *requests
	fmt.Printf("client-go clusters=%d requests=%d (%d failed) wall=%.2fs cpu=%.2fs cpu-per-request=%.1fus\n",
		*clusters, total, failed, wall, cpu, cpu*1e6/float64(total))
}
