tutti-profile 1
model vgg16
batch 32
forward 0.593796157
optimizer 0.132598863
note measured: torchvision vgg16 (weights=None), SGD momentum 0.9, batch 4, 224x224 synthetic input, 1 threads, torch 1.13.0a0, on Intel(R) Xeon(R) Processor (2 CPUs); medians of 7 steps after 2 warm-up
note measured seconds: forward 4.54891 backward 11.3417 optimizer 1.0158 (backward after the last gradient, not listed: 4.57e-05)
note scaled: every time x 0.130536 so that batch 32 runs at 14.5 images/s (compute linear in the batch, the measured split kept)
note target: one Cori Phase-I (Cray XC40) Haswell node, 2x Xeon E5-2698 v3 (32 cores, 2.3 GHz), the machine of Lee et al. SC18 (MLHPC); one rank = one node
note 14.5 images/s is an estimate (Lee et al.'s single-node time was not found): 30 img/s for VGG-19 training with MKL-DNN on 2x Xeon Gold 6148 (PaddlePaddle benchmark/IntelOptimizedPaddle.md), x 19.6/15.5 GMAC per image (VGG-19/VGG-16), x 0.383 (SP peak 2.36/6.14 TFLOP/s, Haswell/Skylake node)
note batch 32 per node is assumed (the paper's per-node batch was not found); compute scales linearly: multiply every time by b/32 for batch b
grad classifier.6.bias 1000 f32 0.0115254655
grad classifier.6.weight 4096000 f32 2.26166701e-06
grad classifier.3.bias 4096 f32 0.0594254098
grad classifier.3.weight 16777216 f32 5.81498738e-06
grad classifier.0.bias 4096 f32 0.384685983
grad classifier.0.weight 102760448 f32 2.66006273e-06
grad features.28.weight 2359296 f32 0.0323477347
grad features.28.bias 512 f32 1.08749554e-06
grad features.26.weight 2359296 f32 0.0318132471
grad features.26.bias 512 f32 1.23865641e-06
grad features.24.weight 2359296 f32 0.0289761961
grad features.24.bias 512 f32 1.51656706e-06
grad features.21.weight 2359296 f32 0.122969735
grad features.21.bias 512 f32 1.2926981e-06
grad features.19.weight 2359296 f32 0.0998840805
grad features.19.bias 512 f32 6.24954196e-06
grad features.17.weight 1179648 f32 0.0399710309
grad features.17.bias 512 f32 1.72555591e-06
grad features.14.weight 589824 f32 0.0845316205
grad features.14.bias 256 f32 1.52844589e-06
grad features.12.weight 589824 f32 0.0846659923
grad features.12.bias 256 f32 1.44803609e-06
grad features.10.weight 294912 f32 0.0465293712
grad features.10.bias 256 f32 1.48824099e-06
grad features.7.weight 147456 f32 0.150991693
grad features.7.bias 128 f32 6.17696352e-06
grad features.5.weight 73728 f32 0.0850963519
grad features.5.bias 128 f32 1.10642312e-06
grad features.2.weight 36864 f32 0.189881433
grad features.2.bias 64 f32 1.1470198e-06
grad features.0.weight 1728 f32 0.0271673934
grad features.0.bias 64 f32 2.05228686e-06
