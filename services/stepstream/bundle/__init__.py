"""The ``.sftrace`` bundle: build (pure), export (stores to a directory), verify."""

from stepstream.bundle.build import BUNDLE_REDACTED, THINKING_KEY, Bundle, BundleRefused, build_bundle
from stepstream.bundle.verify import Verdict, verify_bundle

__all__ = ["BUNDLE_REDACTED", "THINKING_KEY", "Bundle", "BundleRefused", "Verdict", "build_bundle", "verify_bundle"]
