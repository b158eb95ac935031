"""The Google runners: TPU VMs (:mod:`.tpu`), TPU queued resources (:mod:`.queued`) and GPU VMs
on Compute Engine (:mod:`.gce`).

Each is a provider of plain functions (list a zone, create, request a delete, read a
resource's state) composed with the zonal flow (:mod:`.zonal`: start across zones with the
provisioning record, adoption, failover, stop, verified delete, ownership by labels) and the
runner kit (:mod:`bastion.runners.kit`); :mod:`.api` holds what every Google API call needs.
"""
