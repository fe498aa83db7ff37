# Sourced at the top of a device call (`source bench/device_env.sh`), from the repository root: puts
# what the device image lacks on the path. Carry ".whl" (../shared/tools/device_wheels.sh: Snakemake
# and its needs) and "results/device-site" (bench/device_site.sh: wordfreq, for the coherence score);
# a missing one is named here rather than found later as an ImportError half-way through a call.
# Sets PYTHONPATH, PATH, PYTHONUNBUFFERED (logs as they happen), and NCCL_NVLS_ENABLE=0 (NVLink
# multicast stays off on the lent machines) for the processes the call starts.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
for carried in .whl results/device-site; do
  [ -d "$carried" ] || echo "device_env: no $carried here (not carried in this call, or removed since)" >&2
done
if [ -d .whl ]; then
  # (safe to source under set -e: a failing pip is named here, not fatal)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl > /tmp/device_env_pip.log 2>&1 \
    || echo "device_env: pip could not install .whl/ (/tmp/device_env_pip.log): $(tail -1 /tmp/device_env_pip.log)" >&2
fi
mkdir -p /tmp/site
[ -d results/device-site ] && cp -r results/device-site/* /tmp/site/
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
python3 -c "import snakemake, wordfreq" 2>/dev/null || echo "device_env: snakemake or wordfreq does not import" >&2
