"""An s3:// url asked as a Zarr store where s3:ListBucket is not granted. S3 then answers 403, not
404, for a key that is not there, so the store probe (zarr.json, .zmetadata, .zgroup, .zarray) cannot
tell "absent" from "denied": a suffixless url of a plain data file is read as the data file (it was
refused as "access denied" on its zarr.json), a .zarr url is refused in one line naming the permission,
and so is an unconsolidated store, which only a listing can walk.

moto 5 answers 404 for a missing key even without s3:ListBucket, and its IAM checks fail (500) on a
presigned GET, as refmount reads objects; so S3's 403 for the probe's keys is played by a loopback
range server standing in for the S3 endpoint, and moto, with IAM policies checked, plays the listing
refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.daily import make_daily
from tests.support.moto import TEST_KEYS, moto_server
from tests.support.rangeserver import RangeServer
from tests.support.refusals import refusal_line

PROBED = ("zarr.json", ".zmetadata", ".zgroup", ".zarray")


def test_a_suffixless_data_file_is_read_and_a_zarr_url_says_what_is_missing(mount, tmp_path):
    import xarray as xr
    import zarr

    day = make_daily(tmp_path / "days", 1, nlat=4, nlon=5)[0]
    www = tmp_path / "www"
    (www / "bkt").mkdir(parents=True)
    for name in ("data", "data.zarr"):
        (www / "bkt" / name).write_bytes(day.read_bytes())
    with RangeServer(www) as s3:
        s3.fail_paths = {f"bkt/{name}/{key}": 403 for name in ("data", "data.zarr") for key in PROBED}
        options = ["--remote-options", json.dumps({**TEST_KEYS, "endpoint_url": s3.url})]
        m = mount("s3://bkt/data", *options)
        with xr.open_zarr(m.path, consolidated=False) as got, xr.open_dataset(day) as want:
            np.testing.assert_array_equal(got["tas"].values, want["tas"].values)
        line = refusal_line("s3://bkt/data.zarr", tmp_path / "refused", *options)
        assert "'s3://bkt/data.zarr' cannot be told to be a Zarr store" in line and "s3:ListBucket" in line, line
        assert "zarr.json, .zmetadata, .zgroup, .zarray" in line, line
        # (a store whose root is an array: found, but its .zattrs, absent, is a 403 too; never read as absent)
        zarr.save_array(str(www / "bkt" / "array.zarr"), np.arange(6), zarr_format=2)
        (www / "bkt" / "array.zarr" / ".zattrs").unlink(missing_ok=True)
        s3.fail_paths.update({f"bkt/array.zarr/{key}": 403 for key in ("zarr.json", ".zmetadata", ".zattrs")})
        line = refusal_line("s3://bkt/array.zarr", tmp_path / "refused", *options)
        assert "array.zarr/.zattrs': access denied" in line and "s3:ListBucket" in line, line


def test_an_unconsolidated_store_without_listbucket_names_the_permission(tmp_path):
    import boto3
    import zarr

    store = tmp_path / "v2.zarr"
    zarr.save_group(str(store), a=np.arange(10), zarr_format=2)
    # (IAM policies are checked once the setup below has made its requests: 4, and one per file)
    files = [p for p in sorted(store.rglob("*")) if p.is_file()]
    with moto_server({"INITIAL_NO_AUTH_ACTION_COUNT": str(4 + len(files))}) as endpoint:
        admin = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="AKIAADMIN0000",
                     aws_secret_access_key="x")
        s3, iam = boto3.client("s3", **admin), boto3.client("iam", **admin)
        s3.create_bucket(Bucket="bkt")
        for path in files:
            s3.put_object(Bucket="bkt", Key=f"v2store/{path.relative_to(store)}", Body=path.read_bytes())
        iam.create_user(UserName="reader")
        allowed = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObject",
                                                           "Resource": "arn:aws:s3:::bkt/*"}]}
        iam.put_user_policy(UserName="reader", PolicyName="get", PolicyDocument=json.dumps(allowed))
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        reader = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
        with pytest.raises(Exception, match="AccessDenied"):
            reader.list_objects_v2(Bucket="bkt")  # (the policy is checked now)
        assert reader.get_object(Bucket="bkt", Key="v2store/.zgroup")["Body"].read() == (store / ".zgroup").read_bytes()
        options = {"key": key["AccessKeyId"], "secret": key["SecretAccessKey"], "endpoint_url": endpoint}
        line = refusal_line("s3://bkt/v2store", tmp_path / "mnt", "--remote-options", json.dumps(options))
        assert "'s3://bkt/v2store': access denied" in line and "needs s3:ListBucket on the bucket" in line, line
