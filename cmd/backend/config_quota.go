package main

import (
	"flag"

	"github.com/kbprovider/backend/internal/binding"
)

// quotaFlags are the per-consumer object limits (binding.Quota).
type quotaFlags struct{ quota binding.Quota }

func (f *quotaFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&f.quota.ExportRequests, "consumer-max-export-requests", binding.DefaultMaxExportRequests,
		"how many APIServiceExportRequests one consumer may have in its provider namespace (a ResourceQuota made at each bind)")
	fs.IntVar(&f.quota.Namespaces, "consumer-max-namespaces", binding.DefaultMaxNamespaces,
		"how many APIServiceNamespaces, and so provider namespaces, one consumer may have (a ResourceQuota made at each bind)")
}

// validate hands the values to their owner's check (binding.Quota).
func (f *quotaFlags) validate() (binding.Quota, error) { return f.quota, f.quota.Validate() }
