package crdversions

import (
	"os"
	"testing"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
)

func TestMain(m *testing.M) { os.Exit(controlplane.RunMain(m)) }
